"""Cluster mode asks API discovery whether the Prometheus Operator's PodMonitor is served: the rendered tree then
has a PodMonitor per worker (with Argo CD's SkipDryRunOnMissingResource), else none, so the rendered Application
syncs either way. End to end: the official client against the API server double, a real git remote."""
from __future__ import annotations

import pytest

from tests.cluster_loop_support import World, model_doc
from tests.gitserver import git_server  # noqa: F401  (the fixture)
from tests.kubedouble import kube  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration


def test_where_discovery_finds_the_crd_every_worker_gets_a_podmonitor(kube, git_server, tmp_path):  # noqa: F811
    """(Without the CRD the double answers 404 and no PodMonitor is rendered: tests/test_cluster_profiling_beside.py.)"""
    kube.mock["get", "/apis/monitoring.coreos.com/v1"] << {
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "monitoring.coreos.com/v1",
        "resources": [{"name": "podmonitors", "singularName": "podmonitor", "namespaced": True,
                       "kind": "PodMonitor", "verbs": ["get", "list"]}]}
    world = World(kube, git_server, tmp_path)
    world.setup([model_doc()])
    controller = world.reconciler()
    assert controller.reconcile_once().ok
    world.publish_profile()
    assert controller.reconcile_once().ok
    assert world.rendered("Deployment")
    (monitor,) = world.rendered("PodMonitor")
    assert monitor["metadata"]["annotations"]["argocd.argoproj.io/sync-options"] == "SkipDryRunOnMissingResource=true"
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
