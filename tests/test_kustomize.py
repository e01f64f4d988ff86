"""The install as a platform team consumes it: `kubectl kustomize` renders deploy/default and every overlay, each
built-in object passes kubernetes-validate, and the repository set once (the gpushare-controller ConfigMap) reaches
the controller and both Argo CD Applications and the AppProject. Review is the default write-back."""
from __future__ import annotations

import base64
import shutil
import subprocess

import pytest
import yaml
from tests.conftest import REPO_ROOT
from tests.test_cluster_manifests import validate_manifest

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (.ci/run installs Debian's)")
TREES = ["deploy/default", *sorted(str(p.parent.relative_to(REPO_ROOT))
                                   for p in (REPO_ROOT / "deploy" / "overlays").glob("*/kustomization.yaml"))]


def render(directory) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("tree", TREES)
def test_every_tree_renders_valid_objects(tree):
    docs = render(REPO_ROOT / tree)
    assert docs
    for doc in docs:
        validate_manifest(doc)


@pytest.mark.parametrize("tree", TREES)
def test_the_default_write_back_is_review(tree):
    config = next(d for d in render(REPO_ROOT / tree) if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"] == "gpushare-controller")
    assert config["data"]["WRITE_BACK"].startswith(("branch:", "pr:"))


def test_the_repository_is_set_in_one_place(tmp_path):
    """Edit deploy/default/settings.env alone: the controller's ConfigMap, both Applications and the AppProject
    follow."""
    for part in ("config", "deploy"):
        shutil.copytree(REPO_ROOT / part, tmp_path / part)
    (tmp_path / "deploy" / "default" / "settings.env").write_text(
        "GIT_URL=ssh://git@forge.test/team/fleet.git\nGIT_BRANCH=prod\nWRITE_BACK=branch:review/me\n")
    docs = render(tmp_path / "deploy" / "overlays" / "review-pr")
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-controller"]
    assert (config["data"]["GIT_URL"], config["data"]["GIT_BRANCH"], config["data"]["WRITE_BACK"]) == (
        "ssh://git@forge.test/team/fleet.git", "prod", "pr:gpushare/review")
    apps = [d for d in docs if d["kind"] == "Application"]
    assert len(apps) == 2
    assert {(a["spec"]["source"]["repoURL"], a["spec"]["source"]["targetRevision"]) for a in apps} == {
        ("ssh://git@forge.test/team/fleet.git", "prod")}
    (project,) = [d for d in docs if d["kind"] == "AppProject"]
    assert project["spec"]["sourceRepos"] == ["ssh://git@forge.test/team/fleet.git"]
    assert {a["spec"]["project"] for a in apps} == {project["metadata"]["name"]}


def test_the_https_token_component_feeds_the_controller_and_argo_cd_from_one_file(tmp_path):
    for part in ("config", "deploy"):
        shutil.copytree(REPO_ROOT / part, tmp_path / part)
    (tmp_path / "deploy" / "components" / "git-https-token" / "token").write_text("s3cret")
    overlay = tmp_path / "deploy" / "overlays" / "mine"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../../default"], "components": ["../../components/git-https-token"]}))
    docs = render(overlay)
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    controller, argocd = secrets["gpushare-git"], secrets["gpushare-fleet-repository"]
    assert controller["metadata"]["namespace"] == "gpushare-system"
    assert base64.b64decode(controller["data"]["token"]) == base64.b64decode(argocd["data"]["password"]) == b"s3cret"
    assert argocd["metadata"]["labels"]["argocd.argoproj.io/secret-type"] == "repository"
    apps = [d for d in docs if d["kind"] == "Application"]
    assert {a["spec"]["source"]["repoURL"] for a in apps} == {argocd["stringData"]["url"]}
    for doc in docs:
        validate_manifest(doc)
