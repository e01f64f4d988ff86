"""Profiling never waits for ever: with every GPU of the product held by a worker, a new model's profiler Job
runs beside the worker on the GPU it holds (the whole-GPU composition: the UUID the worker reported, by index
before it has, no nvidia.com/gpu request), its profile lands, and the model is placed. End to end: the official client against the API server
double, a real git remote."""
from __future__ import annotations

import pytest
import yaml

from contract.verdicts import Verdict, render_document
from controller.rendering.names import profile_configmap_name
from profiler_job.args import ConfigMapTarget
from profiler_job.publish import configmap_body
from tests.cluster_loop_support import NODE, PRODUCT, REPO, SLOT, World, measured_profile, model_doc
from tests.gitserver import git_server  # noqa: F401  (the fixture)
from tests.kubedouble import kube  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration
LATE = "Qwen/Qwen2.5-0.5B-Instruct-late"  # a second hub id: the profile of QWEN does not cover it


@pytest.fixture
def world(kube, git_server, tmp_path) -> World:  # noqa: F811
    return World(kube, git_server, tmp_path)


def profiler_pod(job: dict) -> tuple[dict, dict]:
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def test_all_gpus_held_fleet_still_gets_its_new_model_profiled(world):
    world.setup([model_doc()])
    controller = world.reconciler()
    assert controller.reconcile_once().ok
    (job,) = world.rendered("Job")
    spec, container = profiler_pod(job)
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # the L4 is free: a whole GPU
    world.publish_profile()
    assert controller.reconcile_once().ok
    assert [d["metadata"]["name"] for d in world.rendered("Deployment")]  # chat's worker now holds the only L4

    late = model_doc("late", model=LATE)
    world.server.push_files(REPO, {"models/llm/late.yaml": yaml.safe_dump(late).encode()}, "late: a new model")
    world.kube.seed("elasticmodels", late)
    third = controller.reconcile_once()
    assert third.ok and third.published.changed
    (job,) = world.rendered("Job")
    spec, container = profiler_pod(job)
    assert job["metadata"]["annotations"]["gpushare.dev/model"] == LATE
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": PRODUCT, "kubernetes.io/hostname": NODE}
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert {e["name"]: e.get("value") for e in container["env"]}["NVIDIA_VISIBLE_DEVICES"] == "0"
    assert world.conditions("late")["Profiled"]["status"] == "False"

    profile = measured_profile() | {"model": LATE}
    target = ConfigMapTarget("llm", profile_configmap_name(LATE, "main", PRODUCT))
    world.kube.seed("configmaps", configmap_body(target, profile))  # what the Job beside the worker publishes
    fourth = controller.reconcile_once()
    assert fourth.ok and fourth.published.changed
    assert world.rendered("Job") == []
    assigned = yaml.safe_load(world.files()["decisions/llm/late.yaml"])["status"]["assigned"]
    assert (assigned["mode"], assigned["gpu"]["slot"]) == ("resident", f"{NODE}/gpu0")
    assert world.conditions("late")["Profiled"]["status"] == "True"


def test_beside_a_worker_the_profiler_gets_the_gpu_the_worker_reported_not_an_index(world):
    """On a multi-GPU node the device plugin decides which GPU a worker holds: the worker reports its UUID beside
    its verdicts, and the next profiler Job beside it is given that device."""
    uuid = "GPU-8d1e0c1a-3f4b-4c2d-9e77-0a1b2c3d4e5f"
    world.setup([model_doc()])
    controller = world.reconciler()
    assert controller.reconcile_once().ok
    world.publish_profile()
    assert controller.reconcile_once().ok  # chat's worker holds the only L4
    applied = Verdict("chat", "llm", "resident", "applied", "Fits", "ok", 1, 2, 0)
    world.worker_reports(data=render_document(SLOT, [applied], uuid))
    assert controller.reconcile_once().ok  # reads the report

    late = model_doc("late", model=LATE)
    world.server.push_files(REPO, {"models/llm/late.yaml": yaml.safe_dump(late).encode()}, "late: a new model")
    world.kube.seed("elasticmodels", late)
    assert controller.reconcile_once().ok
    (job,) = world.rendered("Job")
    _, container = profiler_pod(job)
    assert {e["name"]: e.get("value") for e in container["env"]}["NVIDIA_VISIBLE_DEVICES"] == uuid
    args = container["args"]
    assert int(args[args.index("--max-gpu-memory-mib") + 1]) > 0  # what chat's worker leaves free
    assert world.rendered("PodMonitor") == []  # the double serves no PodMonitor CRD (API discovery: 404)
