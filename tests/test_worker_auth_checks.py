"""Nothing opens the worker's API without a word (worker/auth_checks.py, docs/security.md).

A setting an earlier version honoured for authorisation (GPUSHARE_API_KEY) refuses the start, naming the variable
and what replaces it, never its value; `--authorization none` (the default by hand) on an address beyond loopback
warns at start and on /healthz, where the OpenAPI description says; loopback gives no warning. Each rule is held at
the unit level and through `python -m worker` in a subprocess."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import jsonschema
import pytest
import yaml

import schemas
from worker.auth_checks import OPEN_REASON, contradictions, is_loopback, open_api_warnings, retired_settings
from worker_support import REPO_ROOT, WorkerProcess, config_document, model_entry  # noqa: F401
from worker_support import tiny_models  # noqa: F401  (a fixture, used by name)

SECRET = "sk-old-worker-key-5e1f"


@pytest.mark.parametrize("environ, refused", [
    pytest.param({}, False, id="nothing-set"),
    pytest.param({"GPUSHARE_API_KEY": SECRET}, True, id="old-api-key-set"),
    pytest.param({"GPUSHARE_API_KEY": ""}, True, id="old-api-key-set-empty"),
    pytest.param({"GPUSHARE_YAML_MAX_NODES": "10", "HF_TOKEN": "x"}, False, id="other-settings-only"),
])
def test_a_retired_authorisation_setting_is_named_with_its_replacement_never_its_value(environ, refused):
    messages = retired_settings(environ)
    assert len(messages) == refused
    for message in messages:
        assert message.startswith("GPUSHARE_API_KEY is set")
        for replacement in ("--authorization kubernetes", "--api-key-secret NAME/KEY", "apiKeySecret",
                            "docs/operations.md"):
            assert replacement in message
        assert SECRET not in message


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False), ("192.168.1.20", False),
    ("fe80::1%eth0", False), ("gpu-node-1", False), ("localhost.example.com", False), ("128.0.0.1", False),
])
def test_loopback_is_127_slash_8_ipv6_loopback_and_localhost_only(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("authorization, host, warned", [
    pytest.param("none", "0.0.0.0", True, id="open-on-every-address"),
    pytest.param("none", "10.1.2.3", True, id="open-on-one-address"),
    pytest.param("none", "127.0.0.1", False, id="open-on-loopback"),
    pytest.param("none", "::1", False, id="open-on-ipv6-loopback"),
    pytest.param("kubernetes", "0.0.0.0", False, id="authorised-on-every-address"),
])
def test_an_open_api_beyond_loopback_warns(authorization, host, warned):
    warnings = open_api_warnings(authorization, host, 8000)
    assert [w["reason"] for w in warnings] == ([OPEN_REASON] if warned else [])
    for warning in warnings:
        assert f"{host}:8000" in warning["message"] and "--authorization kubernetes" in warning["message"]


@pytest.mark.parametrize("authorization, key_secret, refused", [
    pytest.param("none", "llm-api/key", True, id="keys-that-nothing-checks"),
    pytest.param("kubernetes", "llm-api/key", False, id="keys-checked"),
    pytest.param("none", None, False, id="open-on-purpose"),
    pytest.param("none", "", False, id="empty-flag-is-no-keys"),
])
def test_an_api_key_secret_without_authorisation_is_a_contradiction(authorization, key_secret, refused):
    messages = contradictions(authorization, key_secret)
    assert len(messages) == refused
    for message in messages:
        assert "--api-key-secret llm-api/key" in message and "--authorization kubernetes" in message


def test_python_m_worker_with_keys_but_no_authorisation_refuses_to_start(tmp_path):
    done = _worker(["--authorization", "none", "--api-key-secret", "llm-api/key"], {}, tmp_path)
    assert done.returncode == 2, done.stderr
    assert "error: KeysWithoutAuthorization: --api-key-secret llm-api/key is set with --authorization none" \
        in done.stderr


def _worker(arguments: list[str], env: dict, tmp_path) -> subprocess.CompletedProcess:
    config = tmp_path / "worker.yaml"
    config.write_text(yaml.safe_dump(config_document([])))
    environ = {k: v for k, v in os.environ.items() if k != "GPUSHARE_API_KEY"}
    with socket.socket() as probe:  # a worker that ignored the setting would serve here until the timeout
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return subprocess.run([sys.executable, "-m", "worker", "--config", str(config), "--port", str(port), *arguments],
                          cwd=REPO_ROOT, env={**environ, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("arguments", [
    pytest.param([], id="authorization-none"),
    pytest.param(["--authorization", "kubernetes", "--api-key-secret", "llm-api/key"], id="authorization-kubernetes"),
])
def test_python_m_worker_with_the_old_api_key_refuses_to_start(tmp_path, arguments):
    done = _worker(arguments, {"GPUSHARE_API_KEY": SECRET}, tmp_path)
    assert done.returncode == 2, done.stderr
    assert "error: RetiredSetting: GPUSHARE_API_KEY is set" in done.stderr
    assert "--authorization kubernetes --api-key-secret NAME/KEY" in done.stderr
    assert SECRET not in done.stderr + done.stdout


def _health_schema() -> dict:
    document = schemas.document("worker-api.openapi.json")
    schema = document["paths"]["/healthz"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    return {**schema, "components": document["components"]}


@pytest.mark.parametrize("host, warned", [
    pytest.param("0.0.0.0", True, id="every-address-warns"),
    pytest.param("127.0.0.1", False, id="loopback-is-quiet"),
])
def test_python_m_worker_open_beyond_loopback_warns_at_start_and_on_healthz(tiny_models, tmp_path, host, warned):
    document = config_document([model_entry("chat", tiny_models["gpt2"], "resident")])
    errors = tmp_path / "stderr.txt"
    with WorkerProcess(tmp_path, document, args=["--host", host], stderr=errors) as process:
        health = httpx.get(f"{process.base_url}/healthz", timeout=10)
        assert health.status_code == 200
        body = health.json()
        jsonschema.validate(body, _health_schema())
    printed = errors.read_text()
    if warned:
        assert [w["reason"] for w in body["warnings"]] == ["AuthorizationOff"]
        assert f"{host}:{process.port}" in body["warnings"][0]["message"]
        assert f"warning: AuthorizationOff: --authorization none on {host}:{process.port}" in printed
    else:
        assert "warnings" not in body
        assert "AuthorizationOff" not in printed
