"""A composition never renders an open API that asked for keys: `apiKeySecret` with `authorization: none` is
refused at `gpushare validate`, at its path, with the fix (controller/inputs/compositions.py); the worker refuses
the same pair of flags at its start (tests/test_worker_auth_checks.py)."""
from __future__ import annotations

import pytest
import yaml

from controller.cli.commands import main
from controller.inputs.compositions import parse_composition

KEYS = {"name": "llm-api", "key": "token"}


def composition(parameters: dict) -> dict:
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "Composition", "metadata": {"name": "mine"},
            "spec": {"parameters": parameters,
                     "steps": {"profiling": {"perModel": ["profiler-job.yaml.j2"]},
                               "serving": {"perWorker": ["worker-deployment.yaml.j2"], "perModel": []}}}}


@pytest.mark.parametrize("parameters, refused", [
    pytest.param({"authorization": "none", "apiKeySecret": KEYS}, True, id="keys-with-authorization-none"),
    pytest.param({"authorization": "kubernetes", "apiKeySecret": KEYS}, False, id="keys-checked"),
    pytest.param({"apiKeySecret": KEYS}, False, id="keys-with-the-default-authorization"),
    pytest.param({"authorization": "none"}, False, id="open-on-purpose"),
    pytest.param({"authorization": "none", "apiKeySecret": None}, False, id="explicit-no-keys"),
])
def test_validate_refuses_api_keys_that_nothing_would_check(parameters, refused, tmp_path, capsys):
    parsed, errors = parse_composition(composition(parameters), "compositions/mine.yaml")
    assert (parsed is None) == refused, errors
    assert [(e.reason, e.path) for e in errors] == (
        [("KeysWithoutAuthorization", "spec.parameters.apiKeySecret")] if refused else [])
    if refused:
        assert "authorization: kubernetes" in errors[0].fix and "remove apiKeySecret" in errors[0].fix
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(composition(parameters)))
    assert main(["validate", str(path)]) == (1 if refused else 0)
    said = capsys.readouterr()
    assert ("KeysWithoutAuthorization" in said.out + said.err) == refused
