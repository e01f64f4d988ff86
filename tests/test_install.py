"""The install: `make install.yaml` renders valid objects whose two image references come from one setting,
that setting reaches every rendered worker and profiler Job, and the wheel ships examples/ for `gpushare demo`."""
from __future__ import annotations

import os
import shutil
import re
import shlex
import subprocess
import sys
import zipfile

import pytest
import yaml
from kubernetes_validate import validate

from controller.cli.commands import _parser
from controller.rendering.compose import compose
from controller.inputs.compositions import load_compositions, shipped_compositions
from controller.cli.installmanifest import install_documents
from controller.cli.common import install_values
from controller.rendering.site import InstallParameterInvalid, with_install_parameters
from tests.compose_scenario import MODELS, PLAN, SLOTS
from tests.conftest import REPO_ROOT

CONTROLLER_IMAGE, WORKER_IMAGE = "registry.test/team/controller:7.1", "registry.test/team/worker:7.1-cu130"


@pytest.fixture(scope="module")
def docs():
    return install_documents(REPO_ROOT / "config", controller_image=CONTROLLER_IMAGE, worker_image=WORKER_IMAGE)


def images_in(doc) -> list[str]:
    """Every `image:` value anywhere in an object."""
    if isinstance(doc, dict):
        return [v for k, v in doc.items() if k == "image"] + [i for v in doc.values() for i in images_in(v)]
    return [i for v in doc for i in images_in(v)] if isinstance(doc, list) else []


def test_every_install_object_is_a_valid_kubernetes_object_strictly(docs):
    for doc in docs:
        validate(doc, "1.30", strict=True)  # the CRD too: apiextensions.k8s.io/v1 is a built-in kind
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Namespace", "gpushare-system"), ("CustomResourceDefinition", "elasticmodels.gpushare.dev"),
            ("Deployment", "gpushare-controller"), ("ConfigMap", "gpushare-controller")} <= kinds


def test_both_image_references_come_from_the_one_setting(docs):
    assert [i for d in docs for i in images_in(d)] == [CONTROLLER_IMAGE]  # the controller's, and nothing else
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-controller"]
    assert config["data"]["WORKER_IMAGE"] == WORKER_IMAGE


def controller_args(docs) -> list[str]:
    """The controller container's args with $(VAR) expanded as the kubelet does, from its ConfigMap."""
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-controller"]
    env = {e["name"]: config["data"][e["valueFrom"]["configMapKeyRef"]["key"]]
           for e in container["env"] if "configMapKeyRef" in e.get("valueFrom", {})}
    env |= {"POD_NAME": "gpushare-controller-0", "POD_NAMESPACE": "gpushare-system"}
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in container["args"]]


def test_the_configured_worker_image_reaches_every_rendered_worker_and_profiler_job(docs):
    args = _parser().parse_args(controller_args(docs))  # the controller's real command line
    assert args.worker_image == WORKER_IMAGE
    compositions = with_install_parameters(shipped_compositions(), install_values(args))
    files = compose(MODELS, PLAN, SLOTS, compositions=compositions).files
    pods = []
    for path, text in files.items():
        doc = yaml.safe_load(text) if path.endswith(".yaml") else None
        if doc and doc["kind"] in ("Deployment", "Job"):
            pods.append((doc["kind"], doc["spec"]["template"]["spec"]))
    assert {kind for kind, _ in pods} == {"Deployment", "Job"}
    for kind, spec in pods:
        assert set(images_in(spec)) == {WORKER_IMAGE}, kind


def test_a_composition_that_sets_its_own_image_keeps_it(tmp_path):
    root = tmp_path / "templates"
    import shutil
    shutil.copytree(REPO_ROOT / "templates", root)
    kai = root / "compositions" / "kai.yaml"
    kai.write_text(kai.read_text().replace("  parameters:\n", "  parameters:\n    image: registry.test/kai:1\n"))
    found = with_install_parameters(load_compositions(root), {"image": WORKER_IMAGE})
    assert (found["kai"].parameters["image"], found["default"].parameters["image"]) == ("registry.test/kai:1",
                                                                                       WORKER_IMAGE)


@pytest.mark.parametrize("values, match", [
    pytest.param({"image": ""}, "install parameter image: '': '' should be non-empty", id="empty-image"),
    pytest.param({"imag": "x"}, "no composition parameter is named 'imag'", id="unknown-parameter"),
])
def test_bad_install_parameters_are_refused_with_the_schema_reason(values, match):
    with pytest.raises(InstallParameterInvalid, match=match):
        with_install_parameters(shipped_compositions(), values)


def test_reconcile_refuses_an_empty_worker_image_before_touching_git(capsys, tmp_path):
    from controller.cli.commands import main
    assert main(["reconcile", "--offline", "--repo", str(tmp_path / "none"), "--worker-image", ""]) == 2
    assert "[InstallParameterInvalid] install parameter image" in capsys.readouterr().err


def test_make_install_yaml_passes_the_one_setting_to_the_renderer():
    out = subprocess.run(["make", "-n", "-B", "install.yaml", "REGISTRY=registry.test/me", "VERSION=9.9"],
                         cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    (line,) = [line for line in out.splitlines() if "controller.cli.installmanifest" in line]
    words = shlex.split(line)
    assert words[words.index("--controller-image") + 1] == "registry.test/me/gpushare-controller:9.9"
    assert words[words.index("--worker-image") + 1] == "registry.test/me/gpushare-worker:9.9"


def test_installmanifest_cli_writes_one_stream_of_every_object():
    out = subprocess.run([sys.executable, "-m", "controller.cli.installmanifest", "--controller-image", CONTROLLER_IMAGE,
                          "--worker-image", WORKER_IMAGE], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    streamed = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert streamed == install_documents(REPO_ROOT / "config", controller_image=CONTROLLER_IMAGE,
                                         worker_image=WORKER_IMAGE)


@pytest.mark.slow
def test_the_wheel_ships_examples_and_gpushare_demo_runs_from_it(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(REPO_ROOT)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("gpushare_elastic-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpushare_examples/fleet/gpus.yaml" in names and "templates/_pod-placement.j2" in names
    modules = {str(p.relative_to(REPO_ROOT)) for top in ("contract", "controller", "gitops", "profiler_job", "worker", "schemas",
                                                         "templates") for p in (REPO_ROOT / top).rglob("*.py")}
    assert sorted(modules - set(names)) == [], "add the missing packages to [tool.setuptools] packages"
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}  # the wheel's modules first, not the checkout's
    run = subprocess.run([sys.executable, "-m", "controller.cli.commands", "demo"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"seeded a throwaway git repository from {site / 'gpushare_examples' / 'fleet'}" in run.stdout
    assert "A second pass over the same inputs commits nothing" in run.stdout


def test_the_two_controller_replicas_get_a_disruption_budget_and_spread_over_nodes(docs):
    (pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pods = deployment["spec"]["template"]
    assert deployment["spec"]["replicas"] == 2 and pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pods["metadata"]["labels"].items()
    (term,) = pods["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pods["metadata"]["labels"].items()


# The part of Argo CD's Application schema these manifests use (a custom resource: kubernetes-validate has none).
APPLICATION_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "argoproj.io/v1alpha1"}, "kind": {"const": "Application"},
        "spec": {"type": "object", "required": ["project", "source", "destination"], "additionalProperties": False,
                 "properties": {
                     "project": {"type": "string"},
                     "source": {"type": "object", "required": ["repoURL", "path"]},
                     "destination": {"type": "object", "required": ["server", "namespace"], "additionalProperties": False,
                                     "properties": {"server": {"type": "string"}, "namespace": {"type": "string"}}},
                     "syncPolicy": {"type": "object", "additionalProperties": False, "properties": {
                         "automated": {"type": "object"}, "retry": {"type": "object"},
                         "syncOptions": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z]+=.+$"},
                                         "contains": {"const": "CreateNamespace=true"}}}}}}}}


@pytest.mark.parametrize("name", ["application-models.yaml", "application-rendered.yaml"])
def test_argo_cd_applications_create_the_namespace_they_sync_into(name):
    import jsonschema
    doc = yaml.safe_load((REPO_ROOT / "config" / "argocd" / name).read_text())
    jsonschema.Draft202012Validator(APPLICATION_SCHEMA).validate(doc)
    assert doc["spec"]["destination"]["namespace"] == "gpushare-system"


def test_repository_compositions_run_the_installs_worker_image_unless_they_set_their_own(tmp_path):
    from controller.cli.offline import pass_over
    root = tmp_path / "fleet"
    shutil.copytree(REPO_ROOT / "examples" / "fleet", root)
    (root / "compositions").mkdir()
    shipped = (REPO_ROOT / "templates" / "compositions" / "default.yaml").read_text()
    (root / "compositions" / "default.yaml").write_text(shipped.replace("    workerNamespace: gpushare-system\n",
                                                                        "    workerNamespace: gpushare-system\n"
                                                                        "    workerCpu: \"4\"\n"))
    files = pass_over(root, processes=1, install={"image": WORKER_IMAGE}).rendered.files
    specs = [yaml.safe_load(t)["spec"]["template"]["spec"] for p, t in files.items()
             if "/deployment-" in p or "/job-" in p]
    assert specs and all(set(images_in(s)) == {WORKER_IMAGE} for s in specs)
    workers = [yaml.safe_load(t) for p, t in files.items() if "/deployment-worker-" in p]
    assert workers and {w["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]
                        for w in workers} == {"4"}  # the repository's composition rendered them


@pytest.mark.parametrize("url,interval", [("", None), ("http://prometheus-operated.monitoring:9090", 300)],
                         ids=["empty-prometheus-url-turns-right-sizing-off", "a-prometheus-url-runs-it-every-5m"])
def test_the_installed_controller_runs_right_sizing_only_with_a_prometheus_url(docs, url, interval, caplog):
    import copy
    import logging

    from controller.cli.rightsizing_loop import schedule_from

    docs = copy.deepcopy(docs)
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-controller"]
    assert config["data"]["PROMETHEUS_URL"] == ""  # shipped off: nothing to reach until the user says where
    config["data"]["PROMETHEUS_URL"] = url
    args = _parser().parse_args(controller_args(docs))
    with caplog.at_level(logging.INFO, logger="gpushare.rightsizing"):
        schedule = schedule_from(args)
    if interval is None:
        assert schedule is None and "right-sizing is off: no Prometheus URL" in caplog.text
        assert "PROMETHEUS_URL" in caplog.text
    else:
        assert schedule.interval_s == interval and schedule.window_s == 2 * 86400 and "right-sizing on" in caplog.text
