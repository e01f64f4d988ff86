"""Every name that crosses a process boundary: the API group, labels, annotations, ConfigMap keys.

Owns the strings the controller, the worker, the profiler Job, the templates and
Argo CD's health check agree on. Nothing else spells one out: the controller reads
what the worker and profiler write by these names, and the templates get them as
the Jinja global `wire` (controller.rendering.render). Pure constants.
"""
from __future__ import annotations

GROUP = "gpushare.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# The ElasticModel custom resource.
KIND = "ElasticModel"
PLURAL = "elasticmodels"
SINGULAR = "elasticmodel"

# Argo CD's Application (read, never written).
ARGO_GROUP, ARGO_VERSION, ARGO_PLURAL = "argoproj.io", "v1alpha1", "applications"

# NVIDIA GPU Feature Discovery node labels.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, as a string
GPU_COUNT_LABEL = "nvidia.com/gpu.count"

# Labels and annotations gpushare sets on what it renders or publishes.
WORKER_LABEL = f"{GROUP}/worker"
SLOT_LABEL = f"{GROUP}/slot"  # also an annotation on the verdicts ConfigMap
ELASTICMODEL_LABEL = f"{GROUP}/elasticmodel"
MODEL_ANNOTATION = f"{GROUP}/model"
REVISION_ANNOTATION = f"{GROUP}/revision"
SOURCE_ANNOTATION = f"{GROUP}/source"  # the models/ file an ElasticModel was read from
CONFIG_CHECKSUM_ANNOTATION = f"{GROUP}/config-checksum"
# a worker Deployment's host memory need (its base plus the pinned copies of its swap and elastic models), on the
# Deployment, not its pod template: the controller resizes the running pod's request to it in place
HOST_MEMORY_ANNOTATION = f"{GROUP}/host-memory"
# a worker pod's slot capacity (worker.yaml's slot.capacityBytes), on its pod template: the one worker.yaml change a
# running worker cannot apply in place (worker/reconfigure.py), so a change of it rolls the pod
SLOT_CAPACITY_ANNOTATION = f"{GROUP}/slot-capacity-bytes"
PROFILE_CONFIGMAP_ANNOTATION = f"{GROUP}/profile-configmap"
URL_ANNOTATION = f"{GROUP}/url"  # a model's Service: its OpenAI base URL
BESIDE_SLOT_ANNOTATION = f"{GROUP}/beside-slot"  # a profiler Job sharing a GPU a worker holds
PROFILE_LABEL = f"{GROUP}/profile"
PROFILE_GPU_PRODUCT_LABEL = f"{GROUP}/gpu-product"
PROFILE_MODEL_HASH_LABEL = f"{GROUP}/model-hash"
VERDICTS_LABEL = f"{GROUP}/verdicts"
POOL_LABEL = f"{GROUP}/pool"  # a worker on a pool node's GPU: the pool (gpus.yaml pools[].name)
POOL_NODE_LABEL = f"{GROUP}/pool-node"  # ... and the plan's name of its node: its workers keep to one node
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
WORKER_POD_LABEL = ("app.kubernetes.io/name", "gpushare-worker")  # on every worker Deployment and its pods

# ConfigMap data keys.
PROFILE_DATA_KEY = "profile.yaml"
VERDICTS_DATA_KEY = "verdicts.yaml"
WORKER_CONFIG_DATA_KEY = "worker.yaml"

# Document kinds of the schemas under schemas/.
PROFILE_KIND = "ModelProfile"
VERDICTS_KIND = "WorkerVerdicts"
WORKER_CONFIG_KIND = "WorkerConfig"

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
