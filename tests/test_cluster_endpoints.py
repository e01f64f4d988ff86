"""The install end to end against the API server double and a real git remote: the rendered tree creates the
model's namespace, gives the model a Service in it and the worker a NetworkPolicy, and the ElasticModel's status
carries the URL to give users."""
from __future__ import annotations

import pytest

from controller.rendering.names import service_name
from tests.cluster_loop_support import World, model_doc
from tests.gitserver import git_server  # noqa: F401  (the fixture)
from tests.kubedouble import kube  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def world(kube, git_server, tmp_path) -> World:  # noqa: F811
    return World(kube, git_server, tmp_path)


def by_name(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}


def test_a_placed_model_gets_its_namespace_service_network_policy_and_status_url(world):
    world.setup([model_doc()])
    controller = world.reconciler()
    assert controller.reconcile_once().ok
    assert ("", "llm") in by_name(world.rendered("Namespace"))  # the profiler Job's namespace, before it
    assert world.status().get("url") is None  # not placed yet
    world.publish_profile()
    assert controller.reconcile_once().ok

    namespaces = by_name(world.rendered("Namespace"))
    assert set(namespaces) == {("", "llm")}  # the install owns gpushare-system: never re-declared
    assert namespaces[("", "llm")]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert namespaces[("", "llm")]["metadata"]["annotations"]["argocd.argoproj.io/sync-options"] == (
        "Prune=false,Delete=false")
    services = by_name(world.rendered("Service"))
    alias = services[("llm", "chat")]
    assert alias["spec"]["externalName"].startswith(f"{service_name('llm', 'chat')}.gpushare-system.svc.")
    assert ("gpushare-system", service_name("llm", "chat")) in services
    (policy,) = world.rendered("NetworkPolicy")
    api, metrics = policy["spec"]["ingress"]
    assert api["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["llm"]
    assert metrics["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert world.status()["url"] == "http://chat.llm.svc/v1"
