"""The GitOps repository's layout: which paths the user owns and which the controller generates.

One place for every folder name. The user owns `models/`, `gpus.yaml`,
`profiles/` (estimated or hand-made profiles) and `compositions/`; the
controller owns `rendered/` (manifests and PLAN.md), `decisions/` and, in
cluster mode, `profiles/measured/`; under `decisions/_last-good/` it keeps the last
copy of each input file that parsed cleanly (what a pass reads while that file is
broken) and each model's generated paths (kept while the model fails to render). The reader (controller.inputs.reader) reads
the user's paths; the shells hand `GENERATED` (or `CLUSTER_GENERATED`) to gitops,
which writes nothing outside the prefixes it is given. `CHECKED_OUT` names what the
controller's own working copy checks out: what a pass reads as files (everything but the
rendered manifests other than PLAN.md, and the decision records, which it reads from git).
"""
from __future__ import annotations

MODELS_DIR = "models"
PROFILES_DIR = "profiles"
COMPOSITIONS_DIR = "compositions"
INVENTORY_FILE = "gpus.yaml"
RENDERED_DIR = "rendered"
DECISIONS_DIR = "decisions"
MEASURED_PROFILES_DIR = f"{PROFILES_DIR}/measured"
PLAN_MD = f"{RENDERED_DIR}/PLAN.md"
LAST_GOOD_DIR = f"{DECISIONS_DIR}/_last-good"  # the last good copy of each input file; `_` is no namespace
OWNERS_FILE = f"{LAST_GOOD_DIR}/_owners.yaml"  # each model's generated paths after the last pass
RIGHTSIZING_DIR = f"{DECISIONS_DIR}/rightsizing"  # right-sizing records: written by the right-sizing pass, kept by the others

GENERATED = (f"{DECISIONS_DIR}/", f"{RENDERED_DIR}/")
CLUSTER_GENERATED = (*GENERATED, f"{MEASURED_PROFILES_DIR}/")

WORKER_FILES = ("deployment-", "configmap-")  # rendered/<namespace>/<prefix>*: a worker's files a pass reads back
# git's non-cone sparse-checkout patterns of the controller's working copy (gitops.WorkingCopy): every path but
# rendered/<namespace>/** and the decision records (decisions/<namespace>/<name>.yaml), the last good copies
# directly under decisions/_last-good/ included again. A pass reads the files it needs of those from git
# (gitops.Checkout.read: the records and the workers' Deployments and ConfigMaps) and lists every generated path
# from git (gitops.Checkout.generated): a restarted controller writes the user's files and little else.
CHECKED_OUT = ("/*", f"!/{RENDERED_DIR}/*/*", f"!/{DECISIONS_DIR}/*/*.yaml", f"/{LAST_GOOD_DIR}/*.yaml")
