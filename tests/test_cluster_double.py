"""tests/kubedouble.py behaves like the API server where cluster code relies on it."""
from __future__ import annotations

import pytest
from kubernetes import client

from tests.kubedouble import kube, label_selector_matches, merge_patch  # noqa: F401  (kube: the fixture)

pytestmark = pytest.mark.integration

EM = ("gpushare.dev", "v1alpha1", "llm", "elasticmodels")
LABELS = {"app": "worker", "tier": "gpu", "env": "prod"}
SELECTOR_CASES = [
    ("equality", "app=worker", True),
    ("double-equals", "app==worker", True),
    ("equality-miss", "app=profiler", False),
    ("inequality", "app!=profiler", True),
    ("inequality-of-a-missing-key", "absent!=x", True),
    ("exists", "tier", True),
    ("exists-miss", "absent", False),
    ("not-exists", "!absent", True),
    ("not-exists-miss", "!tier", False),
    ("in", "env in (prod, staging)", True),
    ("notin", "env notin (prod)", False),
    ("and-of-terms", "app=worker,env in (prod,dev),!absent", True),
    ("one-term-fails", "app=worker,tier=cpu", False),
]


@pytest.mark.parametrize("selector,matches", [c[1:] for c in SELECTOR_CASES], ids=[c[0] for c in SELECTOR_CASES])
def test_label_selectors(selector, matches):
    assert label_selector_matches(selector, LABELS) is matches


def test_merge_patch_follows_rfc_7386():
    target = {"a": {"b": 1, "c": 2}, "list": [1, 2], "gone": 1}
    assert merge_patch(target, {"a": {"b": None, "d": 3}, "list": [3], "gone": None}) == {
        "a": {"c": 2, "d": 3}, "list": [3]}


def _create(api: client.CustomObjectsApi) -> dict:
    return api.create_namespaced_custom_object(*EM[:3], EM[3], {
        "apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel", "metadata": {"name": "chat"},
        "spec": {"model": "org/chat", "memoryBudget": "4Gi"}, "status": {"forged": True}})


def test_server_set_metadata_generation_and_resource_version(kube):
    api = client.CustomObjectsApi(kube.api_client)
    created = _create(api)
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1
    assert "status" not in created  # create ignores status when the status subresource is on
    spec_change = api.patch_namespaced_custom_object(*EM, "chat", {"spec": {"memoryBudget": "8Gi"}})
    assert spec_change["metadata"]["generation"] == 2
    assert int(spec_change["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    status_change = api.patch_namespaced_custom_object_status(*EM, "chat", {"status": {"x": 1}})
    assert status_change["metadata"]["generation"] == 2  # status writes never bump the generation
    no_op = api.patch_namespaced_custom_object_status(*EM, "chat", {"status": {"x": 1}})
    assert no_op["metadata"]["resourceVersion"] == status_change["metadata"]["resourceVersion"]
    assert kube.versions("gpushare.dev/v1alpha1", "elasticmodels", "llm", "chat") == 3
    main = api.patch_namespaced_custom_object(*EM, "chat", {"status": {"x": 2}})
    assert main["status"] == {"x": 1}  # the main resource ignores status


def test_a_stale_resource_version_is_a_conflict(kube):
    api = client.CustomObjectsApi(kube.api_client)
    stale = _create(api)["metadata"]["resourceVersion"]
    api.patch_namespaced_custom_object(*EM, "chat", {"spec": {"memoryBudget": "8Gi"}})
    with pytest.raises(client.ApiException) as caught:
        api.patch_namespaced_custom_object(*EM, "chat", {"metadata": {"resourceVersion": stale},
                                                         "spec": {"memoryBudget": "2Gi"}})
    assert caught.value.status == 409 and "the object has been modified" in caught.value.body
    assert kube.get("gpushare.dev/v1alpha1", "elasticmodels", "llm", "chat")["spec"]["memoryBudget"] == "8Gi"


def test_custom_resources_refuse_strategic_merge(kube):
    api = client.CustomObjectsApi(kube.api_client)
    _create(api)
    with pytest.raises(client.ApiException) as caught:
        api.patch_namespaced_custom_object(*EM, "chat", {"spec": {}},
                                           _content_type="application/strategic-merge-patch+json")
    assert caught.value.status == 415


def test_unknown_resources_and_duplicates(kube):
    api = client.CustomObjectsApi(kube.api_client)
    with pytest.raises(client.ApiException) as caught:
        api.list_cluster_custom_object("example.com", "v1", "widgets")
    assert caught.value.status == 404
    _create(api)
    with pytest.raises(client.ApiException) as caught:
        _create(api)
    assert caught.value.status == 409


def test_an_injected_error_leaves_the_state_alone(kube):
    api = client.CustomObjectsApi(kube.api_client)
    _create(api)
    injected = kube.fail(500, 1, "patch")
    with pytest.raises(client.ApiException) as caught:
        api.patch_namespaced_custom_object(*EM, "chat", {"spec": {"memoryBudget": "8Gi"}})
    assert caught.value.status == 500 and injected.remaining == 0
    assert kube.get("gpushare.dev/v1alpha1", "elasticmodels", "llm", "chat")["spec"]["memoryBudget"] == "4Gi"
    api.patch_namespaced_custom_object(*EM, "chat", {"spec": {"memoryBudget": "8Gi"}})  # used up: served again
