"""compose(): what each composition renders, what a model awaiting a profile gets, and that one bad
model is reported alone while the others render."""
from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace

import kubernetes_validate
import pytest
import yaml

import schemas
from controller.rendering.compose import compose
from controller.rendering.compose_errors import ManifestInvalid, OutputConflict, RenderFailed, UnknownComposition, UnknownSlot
from controller.inputs.compositions import CompositionInvalid, load_compositions, shipped_compositions
from controller.rendering.site import with_install_parameters
from controller.planning.occupancy import device_bytes
from controller.rendering.names import service_name
from controller.types import GpuSlot, Pending, Plan
from templates import TEMPLATE_DIR
from tests.compose_scenario import (BIG, CHAT, CODER, DECISIONS, FRESH, GIB, L4, LAST, MODELS, PLAN, SLOTS, TINY,
                                   decide, model)

WORKERS = "rendered/gpushare-system"
MIB = 1 << 20


@pytest.fixture(scope="module")
def tree():
    return compose(MODELS, PLAN, SLOTS, LAST).files


def service_path(namespace: str, name: str, workers: str = "gpushare-system") -> str:
    return f"rendered/{workers}/service-{service_name(namespace, name)}.yaml"


def load(files: dict[str, str], path: str) -> dict:
    return yaml.safe_load(files[path])


def pod(files, worker: str) -> dict:
    return load(files, f"{WORKERS}/deployment-{worker}.yaml")["spec"]["template"]


def worker_yaml(files, worker: str) -> dict:
    return yaml.safe_load(load(files, f"{WORKERS}/configmap-{worker}.yaml")["data"]["worker.yaml"])


@pytest.fixture
def template_copy(tmp_path):
    """A writable copy of the shipped templates and compositions."""
    root = tmp_path / "templates"
    shutil.copytree(TEMPLATE_DIR, root, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return root


# --- compositions: what each one puts on the worker pod -------------------------------------------

@pytest.mark.parametrize("worker, scheduler, gpu_limits, annotations, labels", [
    pytest.param("worker-node-a-gpu0-default", None, {"nvidia.com/gpu": "1"}, {}, {}, id="default-whole-gpu"),
    pytest.param("worker-node-b-gpu0-kai", "kai-scheduler", {},
                 {"gpu-memory": str(24 * 1024)},  # the slot's GPU, whatever its models: a model change rolls no pod
                 {"kai.scheduler/queue": "default-queue"}, id="kai-gpu-memory-annotation"),
    pytest.param("worker-node-b-gpu1-hami", None, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(24 * 1024)}, {},
                 {}, id="hami-gpumem-limit"),
])
def test_composition_shapes_the_worker_pod(tree, worker, scheduler, gpu_limits, annotations, labels):
    template = pod(tree, worker)
    spec = template["spec"]
    assert spec.get("schedulerName") == scheduler
    assert spec["containers"][0]["resources"].get("limits", {}) == gpu_limits
    assert template["metadata"]["annotations"].get("gpu-memory") == annotations.get("gpu-memory")
    assert template["metadata"]["labels"].get("kai.scheduler/queue") == labels.get("kai.scheduler/queue")
    deployment = load(tree, f"{WORKERS}/deployment-{worker}.yaml")
    assert deployment["metadata"]["labels"].get("kai.scheduler/queue") == labels.get("kai.scheduler/queue")
    slot = next(s for s in SLOTS if worker.startswith(f"worker-{s.node}-gpu{s.index}-"))
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": slot.node, "nvidia.com/gpu.product": slot.product}


def test_worker_pod_runs_the_worker_safely(tree):
    spec = pod(tree, "worker-node-a-gpu0-default")["spec"]
    (container,) = spec["containers"]
    assert container["command"] == ["python", "-m", "worker"]
    assert container["args"] == ["--config", "/etc/gpushare/worker.yaml", "--host", "0.0.0.0", "--port", "8000",
                                 "--metrics-port", "9400", "--authorization", "kubernetes"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", 8000), ("metrics", 9400)]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/gpushare"
    assert next(v for v in spec["volumes"] if v["name"] == "config")["configMap"]["name"] == "worker-node-a-gpu0-default"


def test_deployment_carries_config_checksum_and_pod_the_scrape_target(tree):
    text = load(tree, f"{WORKERS}/configmap-worker-node-a-gpu0-default.yaml")["data"]["worker.yaml"]
    deployment = load(tree, f"{WORKERS}/deployment-worker-node-a-gpu0-default.yaml")
    assert deployment["metadata"]["annotations"]["gpushare.dev/config-checksum"] == hashlib.sha256(
        text.encode()).hexdigest()
    annotations = pod(tree, "worker-node-a-gpu0-default")["metadata"]["annotations"]
    assert "gpushare.dev/config-checksum" not in annotations
    assert (annotations["prometheus.io/scrape"], annotations["prometheus.io/port"], annotations["prometheus.io/path"]) == (
        "true", "9400", "/metrics")


def test_config_change_changes_the_checksum_but_not_the_pod_template(tree):
    bigger = replace(PLAN.decisions[0], budget_bytes=PLAN.decisions[0].budget_bytes + 1)
    files = compose(MODELS, replace(PLAN, decisions=(bigger,) + PLAN.decisions[1:]), SLOTS, LAST).files
    path = f"{WORKERS}/deployment-worker-node-a-gpu0-default.yaml"
    key = "gpushare.dev/config-checksum"
    assert load(files, path)["metadata"]["annotations"][key] != load(tree, path)["metadata"]["annotations"][key]
    assert pod(files, "worker-node-a-gpu0-default") == pod(tree, "worker-node-a-gpu0-default")


def test_a_slot_capacity_change_rolls_the_pod_since_the_worker_cannot_apply_it_in_place(tree):
    """worker/reconfigure.py refuses a changed slot capacity in place: the pod template carries it, so it rolls."""
    smaller = (replace(SLOTS[0], reserved_bytes=SLOTS[0].reserved_bytes * 2),) + SLOTS[1:]
    files = compose(MODELS, PLAN, smaller, LAST).files
    annotations = pod(files, "worker-node-a-gpu0-default")["metadata"]["annotations"]
    assert annotations["gpushare.dev/slot-capacity-bytes"] == str(smaller[0].usable_bytes)
    assert pod(files, "worker-node-a-gpu0-default") != pod(tree, "worker-node-a-gpu0-default")
    assert pod(files, "worker-node-b-gpu0-kai") == pod(tree, "worker-node-b-gpu0-kai")


@pytest.mark.parametrize("worker", ["worker-node-a-gpu0-default", "worker-node-b-gpu0-kai", "worker-node-b-gpu1-hami"])
def test_the_pod_requests_the_fixed_base_and_the_deployment_carries_the_host_memory_need(tree, worker):
    """The pinned host copies of swap and elastic models go to the Deployment's annotation (the controller resizes
    the running pod to it), never to the pod template, where they would roll the pod on every model change."""
    slot = next(s for s in SLOTS if worker.startswith(f"worker-{s.node}-gpu{s.index}-"))
    pinned = sum(d.need_bytes for d in PLAN.decisions if d.slot == slot.id and d.mode in ("swap", "elastic"))
    base = 4 << 30  # workerBaseMemoryBytes' default
    deployment = load(tree, f"{WORKERS}/deployment-{worker}.yaml")
    assert deployment["metadata"]["annotations"]["gpushare.dev/host-memory"] == f"{-(-(base + pinned) // MIB)}Mi"
    assert pod(tree, worker)["spec"]["containers"][0]["resources"]["requests"]["memory"] == f"{base // MIB}Mi"


@pytest.mark.parametrize("worker", ["worker-node-a-gpu0-default", "worker-node-b-gpu0-kai", "worker-node-b-gpu1-hami"])
def test_where_the_cluster_serves_podmonitors_every_worker_gets_one_on_the_metrics_port(tree, worker):
    """Cluster mode sets podMonitor from API discovery (an install parameter); Argo CD may sync without the CRD."""
    files = compose(MODELS, PLAN, SLOTS, LAST, compositions=with_install_parameters(
        shipped_compositions(), {"podMonitor": True})).files
    monitor = load(files, f"{WORKERS}/podmonitor-{worker}.yaml")
    labels = pod(files, worker)["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert monitor["metadata"]["annotations"] == {"argocd.argoproj.io/sync-options":
                                                  "SkipDryRunOnMissingResource=true"}
    assert f"{WORKERS}/podmonitor-{worker}.yaml" not in tree  # offline, by default: none


def test_a_composition_that_sets_podmonitor_wins_over_discovery(template_copy):
    compositions = with_install_parameters(with_parameters(template_copy, "podMonitor: false\n"), {"podMonitor": True})
    files = compose(MODELS, PLAN, SLOTS, compositions=compositions).files
    assert f"{WORKERS}/podmonitor-worker-node-a-gpu0-default.yaml" not in files
    assert f"{WORKERS}/podmonitor-worker-node-b-gpu0-kai.yaml" in files  # kai's parameters are its own


def test_worker_config_validates_and_lists_only_served_models(tree):
    config = worker_yaml(tree, "worker-node-a-gpu0-default")
    schemas.validator("worker-config").validate(config)
    assert config["slot"] == {"id": "node-a/gpu0", "product": "NVIDIA-H200", "capacityBytes": SLOTS[0].usable_bytes}
    assert [(m["name"], m["mode"]) for m in config["models"]] == [
        ("chat-small", "resident"), ("coder", "swap"), ("summarizer", "swap")]
    elastic = worker_yaml(tree, "worker-node-b-gpu0-kai")["models"]
    assert [(m["name"], m["mode"], m["residentLayers"]) for m in elastic] == [("big-70b", "elastic", 9)]
    served = {m["name"] for w in ("worker-node-a-gpu0-default", "worker-node-b-gpu0-kai", "worker-node-b-gpu1-hami")
              for m in worker_yaml(tree, w)["models"]}
    assert "huge" not in served and "fresh" not in served


def test_service_selects_its_slots_worker_pods(tree):
    service = load(tree, service_path("research", "big-70b"))
    labels = pod(tree, "worker-node-b-gpu0-kai")["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["selector"]["gpushare.dev/worker"] == "worker-node-b-gpu0-kai"
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert service["metadata"]["annotations"]["gpushare.dev/elasticmodel"] == "research/big-70b"


def test_worker_namespace_is_a_composition_parameter(template_copy):
    path = template_copy / "compositions" / "default.yaml"
    path.write_text(path.read_text().replace("workerNamespace: gpushare-system", "workerNamespace: gpu-workers"))
    files = compose([CHAT], Plan(decisions=PLAN.decisions[:1]), SLOTS,
                    compositions=load_compositions(template_copy)).files
    assert "rendered/gpu-workers/deployment-worker-node-a-gpu0-default.yaml" in files
    assert service_path("llm", "chat-small", "gpu-workers") in files


# --- profiling: a model without a profile gets only its profiler ----------------------------------

def test_pending_model_renders_only_its_profiler(tree):
    mine = sorted(p for p in tree if p.startswith("rendered/llm/") and not p.startswith(("rendered/llm/service-",
                                                                                         "rendered/llm/namespace-")))
    assert [p.rsplit("/", 1)[1].split("-")[0] for p in mine] == ["job", "role", "rolebinding", "serviceaccount"]
    assert not any("fresh" in p for p in tree if p.startswith(("decisions/", WORKERS)))


def test_profiler_job_spec(tree):
    (path,) = [p for p in tree if p.startswith("rendered/llm/job-")]
    job = load(tree, path)
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    configmap = job["metadata"]["annotations"]["gpushare.dev/profile-configmap"]
    assert container["command"] == ["python", "-m", "profiler_job"]
    assert container["args"] == ["--model", FRESH.model, "--revision", "main", "--gpu-product", "NVIDIA-H200",
                                 "--concurrency", str(FRESH.slo.concurrency), "--context-tokens",
                                 str(FRESH.slo.context_tokens), "--out", f"configmap:llm/{configmap}", "--require-gpu",
                                 "--max-gpu-memory-mib", container["args"][-1]]  # beside the H200's workers
    assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert spec["serviceAccountName"] == "gpushare-profiler"
    assert (job["spec"]["backoffLimit"], job["spec"]["ttlSecondsAfterFinished"]) == (2, 86400)
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


# --- profiling never waits for a GPU that workers hold -------------------------------------------------

def profiler_pod(files: dict[str, str], namespace: str = "llm") -> tuple[dict, dict]:
    (path,) = [p for p in files if p.startswith(f"rendered/{namespace}/job-")]
    job = load(files, path)
    return job, job["spec"]["template"]["spec"]


def test_with_every_h200_held_the_profiler_runs_beside_the_worker_on_its_gpu(tree):
    job, spec = profiler_pod(tree)  # the scenario's one H200 (node-a/gpu0) runs chat-small, coder, summarizer
    (container,) = spec["containers"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200", "kubernetes.io/hostname": "node-a"}
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})  # a whole GPU would wait for ever
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "0"
    held = device_bytes([d for d in DECISIONS if d.slot == "node-a/gpu0" and d.mode != "refused"])
    free_mib = (SLOTS[0].memory_bytes - SLOTS[0].reserved_bytes - held) // MIB
    args = container["args"]
    assert int(args[args.index("--max-gpu-memory-mib") + 1]) == free_mib  # never more than the workers leave
    assert job["spec"]["template"]["metadata"]["annotations"] == {"gpushare.dev/beside-slot": "node-a/gpu0"}


def test_beside_a_worker_that_reported_its_gpu_the_profiler_gets_that_gpu_not_an_index():
    """On a multi-GPU node the device plugin, not the slot's index, decides which GPU the worker has: the worker
    reports its UUID (verdicts), and the profiler beside it is given that device."""
    reported = (replace(SLOTS[0], device_uuid="GPU-8d1e0c1a-3f4b-4c2d-9e77-0a1b2c3d4e5f"), *SLOTS[1:])
    _, spec = profiler_pod(compose(MODELS, PLAN, reported).files)
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-8d1e0c1a-3f4b-4c2d-9e77-0a1b2c3d4e5f"


def test_with_a_free_h200_the_profiler_asks_for_a_whole_gpu():
    free = GpuSlot(node="node-c", index=0, product="NVIDIA-H200", memory_bytes=141 * GIB)
    files = compose(MODELS, PLAN, (*SLOTS, free)).files
    job, spec = profiler_pod(files)
    (container,) = spec["containers"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in container["env"]}
    assert "--max-gpu-memory-mib" not in container["args"]  # a whole GPU: bounded by what the driver says is free
    assert "annotations" not in job["spec"]["template"]["metadata"]
    assert job["metadata"]["name"] != profiler_pod(compose(MODELS, PLAN, SLOTS).files)[0]["metadata"]["name"]


@pytest.mark.parametrize("composition", [
    pytest.param("kai", id="kai-gpu-memory-share-of-the-freest-l4"),
    pytest.param("hami", id="hami-gpumem-vgpu-of-the-freest-l4"),
])
def test_sharing_compositions_profile_beside_the_workers_with_a_memory_share(composition):
    # both L4s are held: node-b/gpu0 by big-70b (20 GiB on the device), node-b/gpu1 by tiny (1 GiB): gpu1 is freer
    late = model("late", "research", hub="Qwen/Qwen2.5-1.5B-Instruct", composition=composition, product=L4)
    pending = Pending(name="late", namespace="research", model=late.model, gpu_product=L4, revision="main",
                      reason="no profile yet")
    result = compose((*MODELS, late), Plan(decisions=DECISIONS, pending=(pending,)), SLOTS)
    assert result.errors == ()
    job, spec = profiler_pod(result.files, "research")
    (container,) = spec["containers"]
    assert spec["nodeSelector"]["kubernetes.io/hostname"] == "node-b"
    assert job["spec"]["template"]["metadata"]["annotations"]["gpushare.dev/beside-slot"] == "node-b/gpu1"
    tiny_free = str(23 * 1024 - 1024)  # 24 GiB - the 1 GiB reserve - tiny's 1 GiB, in MiB
    if composition == "kai":
        assert spec["schedulerName"] == "kai-scheduler"
        assert job["spec"]["template"]["metadata"]["annotations"]["gpu-memory"] == tiny_free
        assert "limits" not in container["resources"]
    else:
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": tiny_free}
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in container["env"]}


def rules(role: dict) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    """Each rule as (apiGroups, resources, resourceNames, verbs): a verb or a name more fails an equality."""
    return [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r.get("resourceNames", ())), tuple(r["verbs"]))
            for r in role["rules"]]


def test_profiler_may_create_configmaps_and_patch_only_its_own(tree):
    (job_path,) = [p for p in tree if p.startswith("rendered/llm/job-")]
    configmap = load(tree, job_path)["metadata"]["annotations"]["gpushare.dev/profile-configmap"]
    role = load(tree, f"rendered/llm/role-{configmap}.yaml")
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "llm"
    assert rules(role) == [(("",), ("configmaps",), (), ("create",)),
                           (("",), ("configmaps",), (configmap,), ("patch",))]
    binding = load(tree, f"rendered/llm/rolebinding-{configmap}.yaml")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": configmap}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpushare-profiler", "namespace": "llm"}]


def test_two_models_awaiting_in_one_namespace_share_the_profiler_identity_not_their_grants():
    other = replace(FRESH, name="fresh-2", model="org/other")
    pending = PLAN.pending + (replace(PLAN.pending[0], name="fresh-2", model="org/other"),)
    result = compose([FRESH, other], Plan(pending=pending), SLOTS)
    assert result.errors == ()
    assert result.owners["rendered/llm/serviceaccount-gpushare-profiler.yaml"] == ("llm/fresh", "llm/fresh-2")
    jobs = [load(result.files, p) for p in result.files if "/job-" in p]
    configmaps = sorted(j["metadata"]["annotations"]["gpushare.dev/profile-configmap"] for j in jobs)
    assert len(set(configmaps)) == 2
    patched = sorted(name for p in result.files if "/role-" in p
                     for _, _, names, verbs in rules(load(result.files, p)) if verbs == ("patch",) for name in names)
    assert patched == configmaps


def test_models_awaiting_one_profile_share_one_job_measured_at_their_largest_concurrency_and_context():
    busy = replace(FRESH, name="fresh-busy", slo=replace(FRESH.slo, concurrency=FRESH.slo.concurrency * 4))
    long = replace(FRESH, name="fresh-long", slo=replace(FRESH.slo, context_tokens=FRESH.slo.context_tokens * 2))
    pending = PLAN.pending + tuple(replace(PLAN.pending[0], name=m.name) for m in (busy, long))
    result = compose([FRESH, busy, long], Plan(pending=pending), SLOTS)
    assert result.errors == ()
    (job,) = [load(result.files, p) for p in result.files if "/job-" in p]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--concurrency") + 1] == str(busy.slo.concurrency)
    assert args[args.index("--context-tokens") + 1] == str(long.slo.context_tokens)


def test_worker_may_create_configmaps_and_patch_only_its_verdicts(tree):
    role = load(tree, f"{WORKERS}/role-worker-node-b-gpu0-kai.yaml")
    verdicts = worker_yaml(tree, "worker-node-b-gpu0-kai")["verdicts"]["configMap"]
    assert (role["metadata"]["namespace"], verdicts["namespace"]) == ("gpushare-system", "gpushare-system")
    assert rules(role) == [(("",), ("configmaps",), (), ("create",)),
                           (("",), ("configmaps",), (verdicts["name"],), ("patch",))]


# --- parameters: the model cache and the hub token ----------------------------------------------------

def with_parameters(template_copy, parameters: str):
    """The shipped compositions with `parameters` (YAML flow-mapping entries) added to default.yaml."""
    path = template_copy / "compositions" / "default.yaml"
    path.write_text(path.read_text().replace("    workerNamespace: gpushare-system\n",
                                             f"    workerNamespace: gpushare-system\n    {parameters}\n"))
    return load_compositions(template_copy)


def cache_of(spec: dict) -> tuple[dict, dict, dict]:
    """The pod's cache volume, its mount and the container's env by name."""
    (container,) = spec["containers"]
    volume = next(v for v in spec["volumes"] if v["name"] == "cache")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "cache")
    return volume, mount, {e["name"]: e for e in container["env"]}


HOST_CACHE = {"name": "cache", "hostPath": {"path": "/var/lib/gpushare/models/public", "type": "DirectoryOrCreate"}}
TOKEN_ENV = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}}


def test_model_cache_claim_is_read_write_for_profiler_and_worker_which_both_download(template_copy):
    compositions = with_parameters(template_copy, "modelCache: {claimName: hf-models}\n"
                                                  "    hfTokenSecret: {name: hf-token, key: token}")
    result = compose(MODELS, PLAN, SLOTS, compositions=compositions)
    assert result.errors == ()
    (job_path,) = [p for p in result.files if p.startswith("rendered/llm/job-")]
    for path in (job_path, f"{WORKERS}/deployment-worker-node-a-gpu0-default.yaml"):
        kubernetes_validate.validate(load(result.files, path), "1.30", strict=True)
    job = load(result.files, job_path)["spec"]["template"]["spec"]
    worker = pod(result.files, "worker-node-a-gpu0-default")["spec"]
    for spec in (job, worker):
        volume, mount, env = cache_of(spec)
        assert volume == {"name": "cache", "persistentVolumeClaim": {"claimName": "hf-models"}}
        assert mount == {"name": "cache", "mountPath": "/cache"}
        assert env["HF_HOME"]["value"] == "/cache/hf" and env["HF_HUB_OFFLINE"]["value"] == "0"
        assert env["HF_TOKEN"] == TOKEN_ENV
        assert "initContainers" not in spec  # a claim's owner is set by fsGroup, not by a root init container
    assert (job["securityContext"]["fsGroup"], job["securityContext"]["fsGroupChangePolicy"]) == (10001,
                                                                                                   "OnRootMismatch")
    kai_volume = cache_of(pod(result.files, "worker-node-b-gpu0-kai")["spec"])[0]
    assert kai_volume == HOST_CACHE  # parameters are per composition: kai's are the defaults


def test_by_default_workers_share_the_nodes_public_cache_and_profilers_never_mount_the_node(tree):
    """Model namespaces stay Pod Security baseline: a profiler Job there downloads into its own emptyDir."""
    (job_path,) = [p for p in tree if p.startswith("rendered/llm/job-")]
    job = load(tree, job_path)["spec"]["template"]["spec"]
    volume, _, env = cache_of(job)
    assert volume == {"name": "cache", "emptyDir": {}} and "initContainers" not in job and "HF_TOKEN" not in env
    for spec in (pod(tree, "worker-node-a-gpu0-default")["spec"],):
        volume, mount, env = cache_of(spec)
        assert (volume, mount) == (HOST_CACHE, {"name": "cache", "mountPath": "/cache"})
        assert {name: env[name].get("value") for name in ("HF_HOME", "HF_HUB_OFFLINE")} == {"HF_HOME": "/cache/hf",
                                                                                           "HF_HUB_OFFLINE": "0"}
        assert "HF_TOKEN" not in env
        (init,) = spec["initContainers"]  # hands the kubelet-created directory to the non-root user
        assert (init["args"], init["securityContext"]["capabilities"]) == (["10001"], {"drop": ["ALL"],
                                                                                      "add": ["CHOWN"]})
        assert init["image"] == spec["containers"][0]["image"]


def test_offline_parameter_alone_keeps_pods_off_the_hub(template_copy):
    compositions = with_parameters(template_copy, "offline: true\n    modelCache: null")
    files = compose(MODELS, PLAN, SLOTS, compositions=compositions).files
    (job_path,) = [p for p in files if p.startswith("rendered/llm/job-")]
    for spec in (load(files, job_path)["spec"]["template"]["spec"], pod(files, "worker-node-a-gpu0-default")["spec"]):
        volume, _, env = cache_of(spec)
        assert volume == {"name": "cache", "emptyDir": {}} and env["HF_HUB_OFFLINE"]["value"] == "1"
        assert "HF_TOKEN" not in env and "initContainers" not in spec


def test_node_selector_tolerations_and_api_key_reach_the_pods(template_copy):
    compositions = with_parameters(template_copy, "nodeSelector: {pool: gpu, kubernetes.io/hostname: elsewhere}\n"
                                   "    tolerations: [{key: dedicated, operator: Equal, value: llm, effect: NoExecute,"
                                   " tolerationSeconds: 30}]\n"
                                   "    apiKeySecret: {name: llm-api, key: key}")
    files = compose(MODELS, PLAN, SLOTS, compositions=compositions).files
    (job_path,) = [p for p in files if p.startswith("rendered/llm/job-")]
    job = load(files, job_path)["spec"]["template"]["spec"]
    worker = pod(files, "worker-node-a-gpu0-default")["spec"]
    assert worker["nodeSelector"] == {"kubernetes.io/hostname": "node-a", "nvidia.com/gpu.product": "NVIDIA-H200",
                                      "pool": "gpu"}  # the slot's own labels are never overridden
    assert job["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200", "pool": "gpu",
                                   "kubernetes.io/hostname": "node-a"}  # beside node-a's worker: its node wins
    toleration = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoExecute",
                  "tolerationSeconds": 30}
    assert worker["tolerations"] == job["tolerations"] == [toleration]
    args = worker["containers"][0]["args"]
    assert args[args.index("--api-key-secret") + 1] == "llm-api/key"  # read in each model's own namespace
    assert "--api-key-secret" not in job["containers"][0]["args"]
    role = load(files, "rendered/llm/role-worker-node-a-gpu0-default.yaml")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["llm-api"],
                              "verbs": ["get"]}]


@pytest.mark.parametrize("parameters, path", [
    pytest.param("modelCache: {}", "modelCache", id="cache-without-claim-or-path"),
    pytest.param("modelCache: {claimName: Bad_Name}", "modelCache", id="cache-claim-not-dns-1123"),
    pytest.param("modelCache: {hostPath: var/models}", "modelCache", id="cache-path-relative"),
    pytest.param("modelCache: {hostPath: /var/../etc}", "modelCache", id="cache-path-climbs-up"),
    pytest.param("hfTokenSecret: {name: hf-token}", "hfTokenSecret", id="token-secret-without-key"),
    pytest.param("hfTokenSecret: {name: hf-token, key: 'a/b'}", "key", id="token-key-with-slash"),
    pytest.param("nodeSelector: {pool: 'a b'}", "nodeSelector", id="node-selector-value-not-a-label-value"),
    pytest.param("tolerations: [{key: a, operator: Maybe}]", "operator", id="toleration-operator-unknown"),
    pytest.param("allowedNamespaces: [Monitoring]", "allowedNamespaces", id="allowed-namespace-not-dns-1123"),
    pytest.param("apiKeySecret: {name: llm-api}", "apiKeySecret", id="api-key-secret-without-key"),
])
def test_malformed_composition_parameters_are_refused(template_copy, parameters, path):
    with pytest.raises(CompositionInvalid, match=f"spec/parameters/.*{path}"):
        with_parameters(template_copy, parameters)


# --- one bad model never blocks the others ---------------------------------------------------------

def test_unknown_composition_fails_that_model_only(tree):
    typo = replace(CODER, composition="kia")
    models = [typo if m.key == CODER.key else m for m in MODELS]
    result = compose(models, PLAN, SLOTS, LAST)
    assert [(type(e), e.ref) for e in result.errors] == [(UnknownComposition, "llm/coder")]
    assert "'kia'" in result.errors[0].message and "default, hami, kai" in result.errors[0].message
    assert service_path("llm", "coder") not in result.files and "decisions/llm/coder.yaml" not in result.files
    assert [m["name"] for m in worker_yaml(result.files, "worker-node-a-gpu0-default")["models"]] == [
        "chat-small", "summarizer"]
    unaffected = {p: t for p, t in tree.items() if not any(s in p for s in ("coder", "node-a-gpu0", "PLAN.md"))}
    assert {p: result.files.get(p) for p in unaffected} == unaffected
    assert "UnknownComposition" in result.files["rendered/PLAN.md"]


def test_decision_on_a_slot_not_in_the_inventory_fails_alone():
    lost = decide(TINY, "resident", replace(SLOTS[2], node="gone"), need=1, footprint=1)
    result = compose(MODELS, replace(PLAN, decisions=PLAN.decisions[:4] + (lost,)), SLOTS)
    assert [(type(e), e.ref) for e in result.errors] == [(UnknownSlot, "research/tiny")]
    assert service_path("research", "big-70b") in result.files


def test_unquoted_value_in_a_template_fails_rendering(template_copy):
    service = template_copy / "model-service.yaml.j2"
    service.write_text(service.read_text().replace("{{ model.model | quote }}", "{{ model.model }}"))
    result = compose(MODELS, PLAN, SLOTS, compositions=load_compositions(template_copy))
    assert {type(e) for e in result.errors} == {RenderFailed}
    assert "without `| quote`" in result.errors[0].message
    assert not any(p.endswith(".yaml") and "/service-" in p for p in result.files)
    assert "decisions/llm/huge.yaml" in result.files  # refused: no Service, still decided


def test_object_that_breaks_the_kubernetes_schema_fails_its_models(template_copy):
    deployment = template_copy / "worker-deployment.yaml.j2"
    deployment.write_text(deployment.read_text().replace("  replicas: 1\n", "  replicas: 1\n  replica: 1\n"))
    result = compose(MODELS, PLAN, SLOTS, compositions=load_compositions(template_copy))
    failed = sorted(e.ref for e in result.errors)
    assert {type(e) for e in result.errors} == {ManifestInvalid}
    assert failed == ["llm/chat-small", "llm/coder", "llm/summarizer", "research/big-70b", "research/tiny"]
    assert "replica" in result.errors[0].message
    assert not any("/deployment-" in p or "/service-" in p for p in result.files)
    assert any("/job-" in p for p in result.files)


def test_two_models_rendering_the_same_object_differently_conflict(template_copy):
    service = template_copy / "model-service.yaml.j2"
    service.write_text(service.read_text().replace("name: {{ service.name | quote }}", 'name: "fixed"'))
    result = compose([CHAT, CODER], Plan(decisions=PLAN.decisions[:2]), SLOTS,
                     compositions=load_compositions(template_copy))
    assert [(type(e), e.ref) for e in result.errors] == [(OutputConflict, "llm/coder")]
    assert load(result.files, f"{WORKERS}/service-fixed.yaml")["metadata"]["annotations"][
        "gpushare.dev/elasticmodel"] == "llm/chat-small"


def test_a_second_composition_on_one_slot_is_refused_not_a_second_worker():
    shared = replace(model("kai-chat", composition="kai"))
    plan = Plan(decisions=PLAN.decisions[:1] + (decide(shared, "resident", SLOTS[0], need=1, footprint=1),))
    rendered = compose([CHAT, shared], plan, SLOTS)
    assert [p for p in rendered.files if "/deployment-" in p] == [f"{WORKERS}/deployment-worker-node-a-gpu0-default.yaml"]
    assert [(e.ref, e.reason) for e in rendered.errors] == [("llm/kai-chat", "MixedCompositions")]


def test_decision_file_is_status_assigned(tree):
    doc = load(tree, "decisions/research/big-70b.yaml")
    assert (doc["kind"], doc["metadata"]) == ("ElasticModel", {"name": "big-70b", "namespace": "research"})
    assert doc["status"]["assigned"]["mode"] == "elastic"
    assert doc["status"]["assigned"]["gpu"] == {"product": "NVIDIA-L4", "slot": "node-b/gpu0"}  # no pool: a fixed node
    assert BIG.key == ("research", "big-70b")


# --- contracts with the programs the manifests run --------------------------------------------------

def test_profiler_accepts_the_jobs_args(tree):
    from profiler_job.args import parse_args

    (path,) = [p for p in tree if p.startswith("rendered/llm/job-")]
    container = load(tree, path)["spec"]["template"]["spec"]["containers"][0]
    options = parse_args(container["args"])
    assert (options.model, options.revision, options.gpu_product, options.concurrency, options.context_tokens) == (
        FRESH.model, "main", "NVIDIA-H200", FRESH.slo.concurrency, FRESH.slo.context_tokens)


def test_worker_accepts_its_config(tree):
    from worker.config import parse_config

    config = parse_config(worker_yaml(tree, "worker-node-b-gpu0-kai"))
    assert [(m.name, m.mode) for m in config.models] == [("big-70b", "elastic")]
    assert (config.verdicts.namespace, config.verdicts.name) == ("gpushare-system", "worker-node-b-gpu0-kai-verdicts")


# --- reachable, protected endpoints ---------------------------------------------------------------------

def test_each_placed_model_gets_a_stable_service_in_its_own_namespace_with_its_url(tree):
    alias = load(tree, "rendered/llm/service-chat-small.yaml")
    assert alias["spec"] == {"type": "ExternalName", "externalName":
                             f"{service_name('llm', 'chat-small')}.gpushare-system.svc.cluster.local"}
    assert alias["metadata"]["annotations"] == {"gpushare.dev/elasticmodel": "llm/chat-small",
                                                "gpushare.dev/url": "http://chat-small.llm.svc/v1"}
    assert "rendered/research/service-big-70b.yaml" in tree
    assert not any(p.endswith(("service-huge.yaml", "service-fresh.yaml")) for p in tree)  # refused, pending


def test_network_policy_admits_only_the_served_namespaces_and_the_named_ones(template_copy):
    compositions = with_parameters(template_copy, "allowedNamespaces: [monitoring, llm]")
    files = compose(MODELS, PLAN, SLOTS, compositions=compositions).files
    policy = load(files, f"{WORKERS}/networkpolicy-worker-node-a-gpu0-default.yaml")
    kubernetes_validate.validate(policy, "1.30", strict=True)
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "gpushare-worker",
                                                            "gpushare.dev/worker": "worker-node-a-gpu0-default"}
    rule, monitoring = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["llm", "monitoring"]}]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert monitoring["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]
    assert monitoring["ports"] == [{"port": "metrics", "protocol": "TCP"}]  # Prometheus: the metrics port only
    kai = load(files, f"{WORKERS}/networkpolicy-worker-node-b-gpu0-kai.yaml")  # kai's parameters are the defaults
    assert kai["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["research"]


def test_every_namespace_written_into_gets_a_namespace_argo_cd_never_prunes(tree):
    namespaces = {p.split("/")[1]: load(tree, p) for p in tree if "/namespace-" in p}
    assert sorted(namespaces) == ["llm", "research"]  # never the install's worker namespace
    for name, doc in namespaces.items():
        kubernetes_validate.validate(doc, "1.30", strict=True)
        assert doc["metadata"]["name"] == name
        assert doc["metadata"]["annotations"] == {"argocd.argoproj.io/sync-options": "Prune=false,Delete=false",
                                                  "argocd.argoproj.io/sync-wave": "-1"}
        assert {k: v for k, v in doc["metadata"]["labels"].items() if k.startswith("pod-security")} == {
            "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/audit": "restricted",
            "pod-security.kubernetes.io/warn": "restricted"}


def _baseline_violations(spec: dict) -> list[str]:
    """What Pod Security `baseline` refuses in a pod spec (the checks that the templates could ever trip)."""
    found = [f"hostPath volume {v['name']}" for v in spec.get("volumes", []) if "hostPath" in v]
    found += [f"host namespace {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    for container in spec.get("initContainers", []) + spec["containers"]:
        context = container.get("securityContext", {})
        if context.get("privileged"):
            found.append(f"{container['name']} privileged")
        baseline_caps = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
        found += [f"{container['name']} adds {c}" for c in context.get("capabilities", {}).get("add", [])
                  if c not in baseline_caps]
        found += [f"{container['name']} hostPort" for port in container.get("ports", []) if port.get("hostPort")]
    return found


_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}


def _restricted_violations(spec: dict) -> list[str]:
    """What Pod Security `restricted` adds to baseline's refusals."""
    found = _baseline_violations(spec)
    pod = spec.get("securityContext", {})
    found += [f"volume {v['name']}" for v in spec.get("volumes", []) if not set(v) - {"name"} <= _RESTRICTED_VOLUMES]
    for container in spec.get("initContainers", []) + spec["containers"]:
        context = container.get("securityContext", {})
        if not context.get("runAsNonRoot", pod.get("runAsNonRoot")) or context.get("runAsUser", pod.get("runAsUser")) == 0:
            found.append(f"{container['name']} may run as root")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{container['name']} allows privilege escalation")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []) or set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{container['name']} capabilities {capabilities}")
        seccomp = context.get("seccompProfile", pod.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{container['name']} seccomp {seccomp}")
    return found


@pytest.mark.parametrize("composition", ["default", "kai", "hami"])
def test_with_the_shipped_compositions_model_namespaces_need_no_more_than_baseline(composition, tree):
    """Every pod the tree puts in a model namespace (profiler Jobs, whole-GPU and beside a worker) passes
    `baseline`, and even `restricted`; only the install's worker namespace holds the node's cache (hostPath)."""
    free = GpuSlot(node="node-c", index=0, product="NVIDIA-H200", memory_bytes=141 * GIB)
    jobs = []
    for slots in (SLOTS, (*SLOTS, free)):  # beside the workers, then on a whole free GPU
        files = compose([replace(m, composition=composition) for m in MODELS], PLAN, slots).files
        jobs += [(path, load(files, path)) for path in files if "/job-" in path]
    assert len(jobs) >= 2
    for path, job in jobs:
        assert not path.startswith(f"{WORKERS}/")
        assert _restricted_violations(job["spec"]["template"]["spec"]) == [], path


def test_the_pod_security_checks_catch_what_the_worker_namespace_needs(tree):
    """The checks above can fail: the worker pod (node cache, root init container) breaks both."""
    spec = pod(tree, "worker-node-a-gpu0-default")["spec"]
    assert "hostPath volume cache" in _baseline_violations(spec)
    assert "cache-owner may run as root" in _restricted_violations(spec)


def test_weights_fetched_with_a_token_stay_in_a_cache_no_other_composition_mounts(template_copy):
    compositions = with_parameters(template_copy, "hfTokenSecret: {name: hf-token, key: token}")
    files = compose(MODELS, PLAN, SLOTS, compositions=compositions).files
    private = cache_of(pod(files, "worker-node-a-gpu0-default")["spec"])[0]["hostPath"]["path"]
    assert private == "/var/lib/gpushare/models/private/worker-node-a-gpu0-default"
    public = cache_of(pod(files, "worker-node-b-gpu0-kai")["spec"])[0]["hostPath"]["path"]
    assert public == "/var/lib/gpushare/models/public" and not private.startswith(public + "/")
