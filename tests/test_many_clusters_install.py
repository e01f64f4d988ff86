"""The many-cluster install as `kubectl kustomize` renders it: one ApplicationSet where Argo CD runs, one controller
per cluster.

deploy/overlays/many-clusters/argocd holds the AppProject (allowed onto every cluster Argo CD knows) and the
ApplicationSet whose git directory generator makes one Application per clusters/<name>/, each syncing
rendered/<name>/ to the cluster secret of that name; its generator and template are checked field by field, and
expanded as Argo CD would expand them over examples/regions, each Application against the strict Application
schema, its source path holding that cluster's reconciled tree, every object of it a kind the project admits.
deploy/overlays/many-clusters is one cluster's controller: no Argo CD object, CLUSTER reaching --cluster, and
the Application it reads by default being the one the ApplicationSet names for its cluster.
"""
from __future__ import annotations

import shutil
import subprocess

import jsonschema
import pytest
import yaml

from controller.cli.cluster_loop import default_applications
from controller.cli.commands import _parser
from controller.inputs.reader import read_repo, repository_clusters
from controller.passes.reconcile import run_pass
from tests.conftest import REPO_ROOT
from tests.test_cluster_manifests import APPLICATION_SCHEMA, validate_manifest

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (.ci/run installs Debian's)")
ARGOCD = REPO_ROOT / "deploy" / "overlays" / "many-clusters" / "argocd"
CONTROLLER = REPO_ROOT / "deploy" / "overlays" / "many-clusters"
BASENAME = "{{.path.basename}}"


def render(directory) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _one(docs: list[dict], kind: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def test_argo_cd_gets_the_project_and_one_application_set_and_no_single_cluster_application():
    docs = render(ARGOCD)
    assert sorted(d["kind"] for d in docs) == ["AppProject", "ApplicationSet"], "the settings ConfigMap stays local"
    project = _one(docs, "AppProject")
    assert project["spec"]["destinations"] == [{"name": "*", "namespace": "*"}]
    validate_manifest(project)


def test_the_application_set_makes_one_application_per_cluster_folder():
    appset = _one(render(ARGOCD), "ApplicationSet")
    spec = appset["spec"]
    (generator,) = spec["generators"]
    assert generator["git"]["directories"] == [{"path": "clusters/*"}]
    assert spec["goTemplate"] is True and "missingkey=error" in spec["goTemplateOptions"]
    assert spec["syncPolicy"] == {"preserveResourcesOnDeletion": True}
    template = spec["template"]
    assert template["metadata"]["name"] == f"gpushare-{BASENAME}"
    assert template["spec"]["destination"]["name"] == BASENAME, "the cluster secret named like the folder"
    assert "server" not in template["spec"]["destination"]
    assert template["spec"]["source"]["path"] == f"rendered/{BASENAME}"
    assert template["spec"]["source"]["directory"] == {"recurse": True}
    assert template["spec"]["project"] == "gpushare"


def test_the_repository_and_branch_are_set_once_in_the_argo_cd_settings(tmp_path):
    shutil.copytree(REPO_ROOT / "config", tmp_path / "config")
    shutil.copytree(REPO_ROOT / "deploy", tmp_path / "deploy")
    settings = tmp_path / "deploy" / "overlays" / "many-clusters" / "argocd" / "settings.env"
    settings.write_text("GIT_URL=ssh://git@forge.test/team/fleet.git\nGIT_BRANCH=prod\n")
    docs = render(settings.parent)
    appset, project = _one(docs, "ApplicationSet")["spec"], _one(docs, "AppProject")["spec"]
    git = appset["generators"][0]["git"]
    assert (git["repoURL"], git["revision"]) == ("ssh://git@forge.test/team/fleet.git", "prod")
    source = appset["template"]["spec"]["source"]
    assert (source["repoURL"], source["targetRevision"]) == ("ssh://git@forge.test/team/fleet.git", "prod")
    assert project["sourceRepos"] == ["ssh://git@forge.test/team/fleet.git"]


def _expanded(template: dict, basename: str) -> dict:
    """The Application Argo CD makes of the template for one directory (its path's basename)."""
    return yaml.safe_load(yaml.safe_dump(template).replace(BASENAME, basename))


def test_each_application_syncs_its_clusters_reconciled_tree_and_only_kinds_the_project_admits(tmp_path):
    docs = render(ARGOCD)
    template, project = _one(docs, "ApplicationSet")["spec"]["template"], _one(docs, "AppProject")["spec"]
    admitted = {(k["group"], k["kind"]) for k in project["namespaceResourceWhitelist"] + project[
        "clusterResourceWhitelist"]}
    root = tmp_path / "regions"
    shutil.copytree(REPO_ROOT / "examples" / "regions", root)
    for cluster in repository_clusters(root):
        app = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
               "metadata": {"namespace": "argocd", **_expanded(template, cluster)["metadata"]},
               "spec": _expanded(template, cluster)["spec"]}
        app["metadata"].pop("labels")
        jsonschema.Draft202012Validator(APPLICATION_SCHEMA).validate(app)
        assert app["metadata"]["name"] == f"gpushare-{cluster}" and app["spec"]["destination"]["name"] == cluster
        files = run_pass(read_repo(root, cluster=cluster)).files
        synced = [yaml.safe_load(text) for path, text in files.items()
                  if path.startswith(app["spec"]["source"]["path"] + "/") and path.endswith(".yaml")]
        assert synced and all(path.startswith((f"rendered/{cluster}/", f"decisions/{cluster}/")) for path in files)
        kinds = {(d["apiVersion"].rpartition("/")[0], d["kind"]) for d in synced}
        assert kinds <= admitted, kinds - admitted
        assert ("gpushare.dev", "ElasticModel") in kinds, "the models placed there reach the cluster with it"


def test_one_clusters_controller_install_carries_no_argo_cd_object_and_knows_its_cluster(monkeypatch):
    docs = render(CONTROLLER)
    assert not [d for d in docs if d["apiVersion"].startswith("argoproj.io/")]
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-controller")
    assert config["data"]["CLUSTER"] == "eu-1" and config["data"]["ARGOCD_APPLICATION"] == ""
    deployment = _one(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUSHARE_CLUSTER"]["valueFrom"]["configMapKeyRef"]["key"] == "CLUSTER"
    values = {name: config["data"].get(e["valueFrom"]["configMapKeyRef"]["key"], "")
              for name, e in env.items() if "configMapKeyRef" in e.get("valueFrom", {})}
    argv = list(container["args"])
    for name, value in values.items():
        argv = [arg.replace(f"$({name})", value) for arg in argv]
    argv = [a.replace("$(POD_NAMESPACE)", "gpushare-system").replace("$(POD_NAME)", "pod") for a in argv]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/etc/gpushare/argocd"]]["secret"]["secretName"] == "gpushare-argocd"
    monkeypatch.setenv("GPUSHARE_CLUSTER", values["GPUSHARE_CLUSTER"])  # the container's environment
    args = _parser().parse_args(argv)
    assert args.cluster == "eu-1" and str(args.argocd_kubeconfig) == "/etc/gpushare/argocd/kubeconfig"
    assert [a for a in args.argocd_application if a] == []
    template = _one(render(ARGOCD), "ApplicationSet")["spec"]["template"]
    assert default_applications(args.cluster) == (("argocd", _expanded(template, "eu-1")["metadata"]["name"]),)
