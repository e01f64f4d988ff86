"""What `python -m worker` checks about authorisation before it serves: nothing opens its API without a word.

Owns three start-time rules (docs/security.md, docs/operations.md "Upgrade"):
- **Retired settings refuse a start.** A setting an earlier version honoured for authorisation (RETIRED: the
  environment variable GPUSHARE_API_KEY, one key for every model the worker served) is no longer read. A worker
  that still finds one in its environment would serve without what it promised, so it refuses to start and
  names the variable and what replaces it. The value is never printed.
- **Keys without authorisation refuse a start.** `--api-key-secret` with `--authorization none` asks for keys that
  nothing would check: the worker refuses to start (CONTRADICTION_REASON) rather than serve open.
- **An open API on the network warns.** `--authorization none` (the default by hand) on an address other than
  loopback (127.0.0.0/8, ::1, localhost) serves every model, /status and /metrics to whoever reaches the port:
  the worker prints a warning at start and `/healthz` carries it in `warnings` until it stops. The rendered
  Deployments run `--authorization kubernetes` (the compositions' default) and warn only where a composition
  chose `authorization: none`.
Called by worker.__main__; the API (worker.api) serves the warnings.
"""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

RETIRED_REASON = "RetiredSetting"
OPEN_REASON = "AuthorizationOff"
CONTRADICTION_REASON = "KeysWithoutAuthorization"
# Each setting an earlier version honoured for authorisation -> what it did and what replaces it.
RETIRED: dict[str, tuple[str, str]] = {
    "GPUSHARE_API_KEY": (
        "one API key for every model the worker served (from the worker namespace's Secret)",
        "--authorization kubernetes --api-key-secret NAME/KEY: each request is authorised for the model's "
        "namespace, with a ServiceAccount token or the API key in the Secret NAME of the model's own namespace "
        "(composition parameters `authorization: kubernetes` and `apiKeySecret: {name, key}`)",
    ),
}


def retired_settings(environ: Mapping[str, str] = os.environ) -> list[str]:
    """One message per retired authorisation setting present in `environ` (set, even empty), by name."""
    return [f"{name} is set, but this worker no longer reads it: it was {did}, and a worker that ignored it would "
            f"serve without it. It is replaced by {replacement}. Move the key into that Secret, then remove "
            f"{name} from the worker's environment (docs/operations.md, \"Upgrade\")"
            for name, (did, replacement) in sorted(RETIRED.items()) if name in environ]


def is_loopback(host: str) -> bool:
    """Whether listening on `host` reaches this machine only: 127.0.0.0/8, ::1 (also IPv4-mapped) or localhost.
    Any other name, and the wildcard addresses (0.0.0.0, ::, empty), listen beyond it."""
    host = host.strip().removeprefix("[").removesuffix("]")
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def contradictions(authorization: str, api_key_secret: str | None) -> list[str]:
    """One message when the flags ask for API keys that `--authorization none` would never check."""
    if authorization != "none" or not api_key_secret:
        return []
    return [f"--api-key-secret {api_key_secret} is set with --authorization none, which checks no key: the API "
            "would be open to everyone who reaches it. Run with --authorization kubernetes to check the keys, or "
            "drop --api-key-secret to serve open on purpose (composition: `authorization: kubernetes`, or no "
            "`apiKeySecret`)"]


def open_api_warnings(authorization: str, host: str, port: int) -> list[dict]:
    """The start-time warnings `/healthz` carries: {reason, message} when the API is open beyond loopback."""
    if authorization != "none" or is_loopback(host):
        return []
    return [{"reason": OPEN_REASON, "message": (
        f"--authorization none on {host or 'every address'}:{port}: anyone who reaches this port may call every "
        f"model and read /status and /metrics, with no credential. Run with --authorization kubernetes "
        "[--api-key-secret NAME/KEY] (what the rendered Deployments run), or listen on 127.0.0.1 only")}]
