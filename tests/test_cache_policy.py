"""hostPath only under the install's cache root: `gpushare validate` refuses a repository composition whose
modelCache.hostPath leaves it, and the pass refuses to render any model whose composition does (issue 21 item 3)."""
from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest
import yaml

from controller.cli.commands import main
from controller.inputs.cache_policy import (DEFAULT_HOST_PATH_ROOT, HOST_PATH_ROOT_SETTING, host_path_problem,
                                               host_path_root)
from controller.rendering.compose import compose
from controller.inputs.compositions import parse_composition, shipped_compositions
from tests.compose_scenario import MODELS, PLAN, SLOTS


def composition(cache) -> dict:
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "Composition", "metadata": {"name": "mine"},
            "spec": {"parameters": {"modelCache": cache},
                     "steps": {"profiling": {"perModel": ["profiler-job.yaml.j2"]},
                               "serving": {"perWorker": ["worker-deployment.yaml.j2"], "perModel": []}}}}


CASES = [
    pytest.param({"hostPath": "/etc"}, "/var/lib/gpushare", False, id="system-dir-refused"),
    pytest.param({"hostPath": "/root/keys"}, "/var/lib/gpushare", False, id="home-dir-refused"),
    pytest.param({"hostPath": "/var/lib/gpushare-evil"}, "/var/lib/gpushare", False, id="sibling-with-root-prefix"),
    pytest.param({"hostPath": "/var/lib"}, "/var/lib/gpushare", False, id="parent-of-root-refused"),
    pytest.param({"hostPath": "/var/lib/gpushare/models"}, "/var/lib/gpushare", True, id="under-root-allowed"),
    pytest.param({"hostPath": "/var/lib/gpushare"}, "/var/lib/gpushare", True, id="the-root-itself-allowed"),
    pytest.param({"hostPath": "/data/models/a"}, "/data/models", True, id="configured-root-honoured"),
    pytest.param({"hostPath": "/var/lib/gpushare/models"}, "/data/models", False, id="default-dir-off-custom-root"),
    pytest.param({"claimName": "models"}, "/var/lib/gpushare", True, id="claim-allowed"),
    pytest.param(None, "/var/lib/gpushare", True, id="emptydir-allowed"),
]


@pytest.mark.parametrize("cache, root, allowed", CASES)
def test_validate_refuses_a_hostpath_outside_the_root(cache, root, allowed, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(HOST_PATH_ROOT_SETTING, root)
    parsed, errors = parse_composition(composition(cache), "compositions/mine.yaml")
    assert (parsed is not None) == allowed, errors
    assert [e.reason for e in errors] == ([] if allowed else ["HostPathOutsideRoot"])
    if not allowed:
        assert errors[0].path == "spec.parameters.modelCache.hostPath" and root in errors[0].fix
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(composition(cache)))
    assert main(["validate", str(path)]) == (0 if allowed else 1)
    said = capsys.readouterr()
    assert ("HostPathOutsideRoot" in said.out + said.err) == (not allowed)


@pytest.mark.parametrize("value, expected", [
    pytest.param(None, DEFAULT_HOST_PATH_ROOT, id="unset-is-default"),
    pytest.param("", DEFAULT_HOST_PATH_ROOT, id="empty-is-default"),
    pytest.param("relative/dir", DEFAULT_HOST_PATH_ROOT, id="relative-is-default"),
    pytest.param("/", DEFAULT_HOST_PATH_ROOT, id="whole-filesystem-never"),
    pytest.param("/data/models/", "/data/models", id="trailing-slash-normalised"),
])
def test_the_root_setting(value, expected):
    assert host_path_root({} if value is None else {HOST_PATH_ROOT_SETTING: value}) == expected


def test_the_pass_refuses_every_model_of_a_composition_outside_the_root():
    """The pass checks the compositions it renders with (a repository's, or the shipped one with the install's
    parameters), not only what `validate` parsed: nothing mounts /etc, every other model still renders."""
    shipped = shipped_compositions()
    bad = dataclasses.replace(shipped["default"], parameters=MappingProxyType(
        {**shipped["default"].parameters, "modelCache": {"hostPath": "/etc"}}))
    rendered = compose(MODELS, PLAN, SLOTS, compositions={**shipped, "default": bad})
    refused = {e.ref for e in rendered.errors if e.reason == "HostPathOutsideRoot"}
    users = {m.ref for m in MODELS if m.composition == "default"}
    assert refused == users and users
    assert not any("path: /etc\n" in text for text in rendered.files.values())
    assert any(f"/{m.namespace}/" in path for m in MODELS if m.composition != "default" for path in rendered.files)


def test_every_shipped_composition_keeps_its_cache_under_the_default_root():
    for name, shipped in shipped_compositions().items():
        assert host_path_problem(shipped.parameters, DEFAULT_HOST_PATH_ROOT) is None, name


def test_a_custom_root_moves_the_default_cache_under_it(monkeypatch):
    """The shipped compositions' default cache lies under the default root; an install with another root renders
    them under its own (`<root>/models`), and a composition that sets its own cache keeps it."""
    from controller.cli.common import install_values
    from controller.rendering.site import with_install_parameters

    monkeypatch.setenv(HOST_PATH_ROOT_SETTING, "/data/gpushare")
    args = type("Args", (), {"worker_image": None})()
    values = install_values(args)
    assert values == {"modelCache": {"hostPath": "/data/gpushare/models"}}
    compositions = with_install_parameters(shipped_compositions(), values)
    assert all(host_path_problem(c.parameters, "/data/gpushare") is None for c in compositions.values())
    assert compositions["default"].parameters["modelCache"] == {"hostPath": "/data/gpushare/models"}
    monkeypatch.delenv(HOST_PATH_ROOT_SETTING)
    assert install_values(args) == {}
