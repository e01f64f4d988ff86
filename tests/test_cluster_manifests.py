"""The install in config/: every manifest is a valid object, the kustomizations list them, RBAC is least privilege."""
from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from controller.kube.crd import CRD_PATH
from controller.rendering.kube_validate import validate_object

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config"
NOT_MANIFESTS = {"kustomization.yaml", "health_test.yaml"}
CRD_VALIDATOR = jsonschema.Draft4Validator(
    yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"])

_STRICT = {"type": "object", "additionalProperties": False}
# The part of Argo CD's Application CRD these manifests use, strict: a typo fails here, not at sync time.
APPLICATION_SCHEMA = {
    **_STRICT, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "argoproj.io/v1alpha1"},
        "kind": {"const": "Application"},
        "metadata": {**_STRICT, "required": ["name", "namespace"], "properties": {
            "name": {"type": "string"}, "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "spec": {**_STRICT, "required": ["project", "source", "destination"], "properties": {
            "project": {"type": "string"},
            "source": {**_STRICT, "required": ["repoURL", "targetRevision", "path"], "properties": {
                "repoURL": {"type": "string", "pattern": "^(https://|ssh://|git@)"},
                "targetRevision": {"type": "string"}, "path": {"type": "string"},
                "directory": {**_STRICT, "properties": {"recurse": {"type": "boolean"}}}}},
            "destination": {**_STRICT, "properties": {"server": {"type": "string"}, "namespace": {"type": "string"},
                                                      "name": {"type": "string"}}},
            "syncPolicy": {**_STRICT, "properties": {
                "automated": {**_STRICT, "properties": {"prune": {"type": "boolean"}, "selfHeal": {"type": "boolean"}}},
                "syncOptions": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z]+=(true|false)$"}},
                "retry": {**_STRICT, "properties": {"limit": {"type": "integer"}, "backoff": {**_STRICT, "properties": {
                    "duration": {"type": "string"}, "factor": {"type": "integer"},
                    "maxDuration": {"type": "string"}}}}}}},
        }},
    },
}


_KINDS = {"type": "array", "items": {**_STRICT, "required": ["group", "kind"],
                                     "properties": {"group": {"type": "string"}, "kind": {"type": "string"}}}}
# The part of Argo CD's AppProject CRD the install uses, strict.
APPPROJECT_SCHEMA = {
    **_STRICT, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "argoproj.io/v1alpha1"},
        "kind": {"const": "AppProject"},
        "metadata": APPLICATION_SCHEMA["properties"]["metadata"],
        "spec": {**_STRICT, "required": ["sourceRepos", "destinations"], "properties": {
            "description": {"type": "string"},
            "sourceRepos": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "destinations": {"type": "array", "items": {**_STRICT, "properties": {
                "server": {"type": "string"}, "namespace": {"type": "string"}, "name": {"type": "string"}}}},
            "clusterResourceWhitelist": _KINDS, "namespaceResourceWhitelist": _KINDS}},
    },
}
CUSTOM = {"Application": APPLICATION_SCHEMA, "AppProject": APPPROJECT_SCHEMA}
PROMETHEUSRULE_SCHEMA = {
    **_STRICT, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
                   "metadata": APPLICATION_SCHEMA["properties"]["metadata"],
                   "spec": {**_STRICT, "required": ["groups"], "properties": {"groups": {"type": "array"}}}},
}


def validate_manifest(doc: dict) -> None:
    """One install object: Argo CD's kinds against the strict schemas above, ElasticModels against the CRD, the
    rest with kubernetes-validate (Kubernetes 1.30, strict)."""
    if doc["kind"] in CUSTOM:
        jsonschema.Draft202012Validator(CUSTOM[doc["kind"]]).validate(doc)
    elif doc["kind"] == "ElasticModel":
        CRD_VALIDATOR.validate(doc)
    elif doc["kind"] == "PodMonitor":
        validate_object(doc)  # the Prometheus Operator's schema the rendered PodMonitors are checked with
    elif doc["kind"] == "PrometheusRule":
        jsonschema.Draft202012Validator(PROMETHEUSRULE_SCHEMA).validate(doc)  # promtool checks the rules
    else:
        kubernetes_validate.validate(doc, "1.30", strict=True)


def _manifests():
    for path in sorted(CONFIG.rglob("*.yaml")):
        if path.name in NOT_MANIFESTS:
            continue
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                yield pytest.param(doc, id=f"{path.relative_to(CONFIG)}#{index}")


@pytest.mark.parametrize("doc", list(_manifests()))
def test_every_manifest_is_a_valid_object(doc):
    validate_manifest(doc)


@pytest.mark.parametrize("kustomization", ["kustomization.yaml", "argocd/kustomization.yaml"])
def test_kustomizations_list_existing_files(kustomization):
    path = CONFIG / kustomization
    resources = yaml.safe_load(path.read_text())["resources"]
    assert resources and all((path.parent / r).is_file() for r in resources)


def test_every_install_manifest_is_in_the_kustomization():
    listed = {(CONFIG / r).resolve() for r in yaml.safe_load((CONFIG / "kustomization.yaml").read_text())["resources"]}
    skipped = ("argocd", "samples")
    install = {p.resolve() for p in CONFIG.rglob("*.yaml")
               if p.name not in NOT_MANIFESTS and p.relative_to(CONFIG).parts[0] not in skipped}
    assert install == listed


def _docs(relative: str) -> list[dict]:
    return list(yaml.safe_load_all((CONFIG / relative).read_text()))


# (group, resource, resourceNames) -> verbs: exactly the API calls of controller/kube/cluster.py and controller/kube/leader.py.
# A verb more (a `watch`, an unused `update`) or less fails here.
CONTROLLER_GRANTS = {
    "rbac/cluster-role.yaml": {
        ("gpushare.dev", "elasticmodels", ()): {"list"},  # Cluster.elastic_models
        ("gpushare.dev", "elasticmodels/status", ()): {"patch"},  # Cluster.patch_status
        ("", "nodes", ()): {"list"},  # Cluster.nodes
        ("", "configmaps", ()): {"list"},  # Cluster.profile_documents, Cluster.verdicts
        ("", "pods", ()): {"list"},  # Cluster.profiler_job (a failed Job's pods), Cluster.worker_pods
        ("", "pods/resize", ()): {"patch"},  # Cluster.resize_pod
        ("batch", "jobs", ()): {"get"},  # Cluster.profiler_job
        ("apps", "deployments", ()): {"get"},  # Cluster.workload, Cluster.deployment
        ("argoproj.io", "applications", ()): {"get"},  # Cluster.application
    },
    "rbac/leader-election-role.yaml": {
        ("coordination.k8s.io", "leases", ()): {"create"},  # LeaseElection: create when missing
        ("coordination.k8s.io", "leases", ("gpushare-controller",)): {"get", "update"},  # read, replace
    },
}


def grants(role: dict) -> dict[tuple[str, str, tuple[str, ...]], set[str]]:
    """Every (group, resource, resourceNames) the role names, with the union of its verbs."""
    found: dict[tuple[str, str, tuple[str, ...]], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                found.setdefault((group, resource, tuple(rule.get("resourceNames", ()))), set()).update(rule["verbs"])
    return found


@pytest.mark.parametrize("relative", CONTROLLER_GRANTS)
def test_the_controller_holds_exactly_the_verbs_its_calls_need(relative):
    [role] = _docs(relative)
    assert grants(role) == CONTROLLER_GRANTS[relative]


def test_the_lease_role_is_bound_in_the_controllers_namespace_only():
    [role] = _docs("rbac/leader-election-role.yaml")
    [binding] = _docs("rbac/leader-election-role-binding.yaml")
    assert (role["kind"], role["metadata"]["namespace"]) == ("Role", "gpushare-system")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}


def test_the_controller_runs_unprivileged_with_credentials_as_files():
    [deployment] = _docs("manager/deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["serviceAccountName"] == "gpushare-controller"
    assert not any("secretKeyRef" in (e.get("valueFrom") or {}) for e in container["env"])  # never in the env
    secret_volumes = {v["name"] for v in pod["volumes"] if "secret" in v}
    assert any(m["name"] in secret_volumes and m["readOnly"] for m in container["volumeMounts"])
    args = container["args"]
    assert args[:6] == ["reconcile", "--kube", "--repo", "$(GIT_URL)", "--branch", "$(GIT_BRANCH)"]
    assert {"livenessProbe", "readinessProbe"} <= set(container)
    assert container["ports"][0]["name"] == "metrics"


def test_the_rendered_application_prunes_and_self_heals():
    [app] = _docs("argocd/application-rendered.yaml")
    assert app["spec"]["source"]["path"] == "rendered"
    assert app["spec"]["syncPolicy"]["automated"] == {"prune": True, "selfHeal": True}
    [config] = _docs("manager/config.yaml")
    assert config["data"]["ARGOCD_APPLICATION"] == f"{app['metadata']['namespace']}/{app['metadata']['name']}"


def test_the_appproject_admits_every_kind_the_tree_and_the_models_hold():
    """Argo CD refuses to sync a kind its project does not list: every kind any shipped composition renders (with
    PodMonitors and per-namespace keys on), and ElasticModels, must be whitelisted, and nothing cluster-wide but
    Namespaces."""
    from controller.rendering.compose import compose
    from controller.inputs.compositions import shipped_compositions
    from controller.rendering.site import with_install_parameters
    from tests.compose_scenario import MODELS, PLAN, SLOTS

    project = yaml.safe_load((CONFIG / "argocd" / "appproject.yaml").read_text())["spec"]
    namespaced = {(k["group"], k["kind"]) for k in project["namespaceResourceWhitelist"]}
    cluster = {(k["group"], k["kind"]) for k in project["clusterResourceWhitelist"]}
    compositions = with_install_parameters(shipped_compositions(), {
        "podMonitor": True, "apiKeySecret": {"name": "llm-api", "key": "key"}})
    rendered = compose(MODELS, PLAN, SLOTS, compositions=compositions)
    kinds = set()
    for path, text in rendered.files.items():
        if path.endswith(".yaml") and path.startswith("rendered/"):
            doc = yaml.safe_load(text)
            kinds.add((doc["apiVersion"].rpartition("/")[0], doc["kind"]))
    assert ("", "Namespace") in kinds and cluster == {("", "Namespace")}
    assert kinds - {("", "Namespace")} <= namespaced, sorted(kinds - namespaced)
    assert ("gpushare.dev", "ElasticModel") in namespaced
