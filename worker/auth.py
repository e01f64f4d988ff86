"""The worker's API key: requests to the OpenAI API must carry it when one is configured.

Owns the check vLLM's `--api-key` makes: with a key set (GPUSHARE_API_KEY, from the Secret the
composition's apiKeySecret names), every request under /v1/ must send `Authorization: Bearer KEY`,
compared in constant time, else 401 in OpenAI's error shape. /healthz, /readyz, /status and
/metrics stay open for probes and Prometheus (the NetworkPolicy limits who reaches them). The key
is never logged. Installed by `python -m worker` on the app worker.api.create_app builds.
"""
from __future__ import annotations

import hmac
import os

from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse

ENV = "GPUSHARE_API_KEY"
PROTECTED = "/v1/"


def api_key_from_env(environ=os.environ) -> str | None:
    """The configured key; None when unset or empty (the API is open)."""
    return environ.get(ENV) or None


def require_api_key(app, key: str | None) -> None:
    """Make `app` refuse /v1/ requests without `Authorization: Bearer <key>`; nothing when `key` is None."""
    if key is None:
        return
    expected = f"Bearer {key}".encode()

    async def check(request: Request, call_next):
        if request.url.path.startswith(PROTECTED):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse({"error": {
                    "message": "this worker requires an API key: send the header 'Authorization: Bearer <key>' "
                               "with the key of the Secret that the composition's apiKeySecret names",
                    "type": "authentication_error", "param": None, "code": "InvalidAPIKey"}}, status_code=401)
        return await call_next(request)

    app.add_middleware(BaseHTTPMiddleware, dispatch=check)
