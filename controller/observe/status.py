"""ElasticModel status: conditions from the pass's verdict and what the cluster reports. Pure.

Owns the `Observed` facts about one model (its Argo CD Application, live Deployment,
profiler Job, worker verdict), the metav1.Condition list derived from them
(`conditions_for`), the status subresource merge-patch body (`status_patch`) and the
change test that keeps the controller from writing an unchanged status
(`needs_write`). The cluster reconcile loop calls these once per model per pass;
controller.kube.cluster builds `Observed` from API objects; the Argo CD health check
(config/argocd/health/...) reads the conditions written here.

Condition types, in the order written: Profiled, Assigned, Synced, Ready, Degraded,
SLOMet when the model has an SLO, and with a right-sizing policy the loop's advisory
UsageAvailable, NeedsCapacity and AtMaxBudget (from its record; they never change Ready
or Degraded). `Degraded=True` marks a failure the user must act on (the message says
what to change); Ready=False without it means "still progressing". lastTransitionTime
moves only when a condition's status flips.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from contract.quantity import format_bytes
from controller.serialize import assigned_patch
from controller.types import Decision, ElasticModel, InputError, Pending

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"
SYNC_FAILED_PHASES = frozenset({"Failed", "Error"})


@dataclass(frozen=True)
class AppState:
    """The Argo CD Application that syncs the rendered tree.

    `contains_commit` is computed by the caller with git ancestry: Argo CD reports the
    branch head it synced, not our commit, so "synced" means that head descends from it.
    """

    name: str
    sync_status: str | None  # Synced | OutOfSync | Unknown
    revision: str | None
    contains_commit: bool
    health: str | None = None
    operation_phase: str | None = None  # Running | Terminating | Failed | Error | Succeeded
    operation_message: str = ""


@dataclass(frozen=True)
class WorkloadState:
    """The model's worker Deployment as its own status reports it."""

    name: str
    available: bool
    message: str = ""


@dataclass(frozen=True)
class JobState:
    """The profiler Job: Running until a Complete or Failed condition; the failure's one line."""

    name: str
    phase: Literal["Running", "Complete", "Failed"]
    message: str = ""
    reason: str = ""  # a Hub refusal's reason (contract.hub), the worker's for the same model; else empty


@dataclass(frozen=True)
class WorkerVerdict:
    """What the worker on the model's slot did with it (its verdict ConfigMap entry)."""

    mode: str
    verdict: Literal["applied", "refused"]
    slot: str  # the slot the worker serves; a verdict from another slot than the decision's is stale
    reason: str = ""
    message: str = ""
    need_bytes: int = 0
    available_bytes: int = 0
    missing_bytes: int = 0
    device_uuid: str | None = None  # the GPU the worker was given (a profiler beside it gets the same one)


@dataclass(frozen=True)
class Observed:
    """Everything the cluster says about one model. `commit` is the git commit that carries
    what was rendered for it (decision or profiler Job); None until one is pushed."""

    commit: str | None = None
    app: AppState | None = None
    workload: WorkloadState | None = None
    job: JobState | None = None
    verdict: WorkerVerdict | None = None


@dataclass(frozen=True)
class _Cond:
    type: str
    status: str
    reason: str
    message: str


def conditions_for(model: ElasticModel, decision: Decision | None, pending: Pending | None,
                   input_error: InputError | None, observed: Observed,
                   previous_conditions: list[dict], now: str) -> list[dict]:
    """metav1.Conditions for one model; lastTransitionTime carried over unless the status flipped."""
    conds = _derive(model, decision, pending, input_error, observed) + _rightsizing(model)
    previous = {c.get("type"): c for c in previous_conditions or []}
    out = []
    for cond in conds:
        before = previous.get(cond.type)
        moved = before is None or before.get("status") != cond.status or not before.get("lastTransitionTime")
        out.append({
            "type": cond.type,
            "status": cond.status,
            "reason": cond.reason,
            "message": cond.message,
            "observedGeneration": model.generation,
            "lastTransitionTime": now if moved else before["lastTransitionTime"],
        })
    return out


def _derive(model: ElasticModel, decision: Decision | None, pending: Pending | None,
            input_error: InputError | None, observed: Observed) -> list[_Cond]:
    if input_error is not None:
        message, reason = _invalid_message(input_error), input_error.reason
        conds = [_Cond("Profiled", UNKNOWN, reason, message),
                 _Cond("Assigned", FALSE, reason, message),
                 _Cond("Synced", UNKNOWN, reason, message)]
        ready = _Cond("Ready", FALSE, reason, message)
        return conds + _ready_and_degraded(ready, degraded=True) + _slo(model, None)

    profiled, assigned, blocker = _profile_and_assignment(decision, pending, observed.job)
    synced, sync_blocker = _synced(observed)
    if blocker is None:
        blocker = sync_blocker
    if blocker is None and decision is not None:
        blocker = _live_blocker(decision, observed)
    if blocker is None:
        assert decision is not None  # no pending, no error: the planner decided
        ready = _Cond("Ready", TRUE, "Ready",
                      f"{decision.mode} on {decision.slot}: commit {_short(observed.commit)} synced by "
                      f"{observed.app.name}, {observed.workload.name} available, worker applied it")
        return [profiled, assigned, synced] + _ready_and_degraded(ready, degraded=False) + _slo(model, decision)
    cond, degraded = blocker
    return [profiled, assigned, synced] + _ready_and_degraded(cond, degraded) + _slo(model, decision)


def _profile_and_assignment(decision: Decision | None, pending: Pending | None, job: JobState | None):
    """Profiled and Assigned, and what blocks Ready at this stage: (Ready condition, degraded) or None."""
    if pending is not None:
        if job is not None and job.phase == "Failed":
            message = f"profiler Job {job.name} failed: {job.message or 'no termination message'}"
            profiled = _Cond("Profiled", FALSE, "ProfileFailed", message)
            blocker = (_Cond("Ready", FALSE, job.reason or "ProfileFailed", message), True)
        else:
            where = f"profiler Job {job.name} is {job.phase.lower()}" if job else "profiler Job not started yet"
            message = f"no profile of {pending.model} on {pending.gpu_product}; {where}"
            profiled = _Cond("Profiled", FALSE, "Profiling", message)
            blocker = (_Cond("Ready", FALSE, "AwaitingProfile", message), False)
        assigned = _Cond("Assigned", FALSE, "AwaitingProfile", f"waiting for the profile of {pending.model}")
        return profiled, assigned, blocker
    if decision is None:
        message = "the controller has not planned this model yet"
        return (_Cond("Profiled", UNKNOWN, "NotPlanned", message), _Cond("Assigned", UNKNOWN, "NotPlanned", message),
                (_Cond("Ready", UNKNOWN, "NotPlanned", message), False))
    profiled = (_Cond("Profiled", TRUE, "ProfileFound", f"using profile {decision.profile}") if decision.profile
                else _Cond("Profiled", UNKNOWN, decision.reason_code, decision.reason))
    if decision.mode == "refused":
        assigned = _Cond("Assigned", FALSE, decision.reason_code, decision.reason)
        return profiled, assigned, (_Cond("Ready", FALSE, decision.reason_code, decision.reason), True)
    assigned = _Cond("Assigned", TRUE, decision.reason_code, f"{decision.mode} on {decision.slot}: {decision.reason}")
    return profiled, assigned, None


def _synced(observed: Observed) -> tuple[_Cond, tuple[_Cond, bool] | None]:
    app = observed.app
    if observed.commit is None:
        cond = _Cond("Synced", FALSE, "NotCommitted", "nothing committed to git for this model yet")
        return cond, (_Cond("Ready", FALSE, "NotCommitted", cond.message), False)
    if app is None:
        message = f"commit {_short(observed.commit)} pushed; the Argo CD Application that syncs it was not found"
        return _Cond("Synced", UNKNOWN, "ApplicationNotFound", message), (
            _Cond("Ready", FALSE, "ApplicationNotFound", message), False)
    if app.operation_phase in SYNC_FAILED_PHASES:
        message = (f"Argo CD Application {app.name} failed to sync ({app.operation_phase}): "
                   f"{app.operation_message or 'no message'}")
        return _Cond("Synced", FALSE, "SyncFailed", message), (_Cond("Ready", FALSE, "SyncFailed", message), True)
    if app.sync_status == "Synced" and app.contains_commit:
        message = (f"Argo CD Application {app.name} synced revision {_short(app.revision)}, "
                   f"which contains commit {_short(observed.commit)}")
        return _Cond("Synced", TRUE, "Synced", message), None
    health = f", health {app.health}" if app.health else ""
    message = (f"Argo CD Application {app.name} is {app.sync_status or 'Unknown'} at revision "
               f"{_short(app.revision)}{health}; waiting for it to sync commit {_short(observed.commit)}")
    return _Cond("Synced", FALSE, "SyncPending", message), (_Cond("Ready", FALSE, "SyncPending", message), False)


def _live_blocker(decision: Decision, observed: Observed) -> tuple[_Cond, bool] | None:
    verdict = observed.verdict if observed.verdict is not None and observed.verdict.slot == decision.slot else None
    current = verdict if verdict is not None and verdict.mode == decision.mode else None
    if current is not None and current.verdict == "refused" and not current.need_bytes:
        # not a memory refusal: the model could not be fetched or read (a gated or missing hub model, bad files)
        return _Cond("Ready", FALSE, current.reason or "WorkerRefused",
                     f"the worker on {decision.slot} could not load the model: {current.message}"), True
    if current is not None and current.verdict == "refused":
        message = (f"the worker on {decision.slot} refused {decision.mode}: needs {format_bytes(current.need_bytes)}, "
                   f"{format_bytes(current.available_bytes)} available, {format_bytes(current.missing_bytes)} missing "
                   f"({current.reason}: {current.message}); the plan counted {format_bytes(decision.footprint_bytes)}. "
                   f"Fix: lower spec.slo.contextTokens or concurrency, or free the GPU memory used outside gpushare")
        return _Cond("Ready", FALSE, "WorkerRefused", message), True
    workload = observed.workload
    if workload is None or not workload.available:
        name = workload.name if workload else "the worker Deployment"
        detail = f": {workload.message}" if workload and workload.message else ""
        if decision.pool is not None:  # its node may not exist yet: the pending Pod is what adds it
            return _Cond("Ready", FALSE, "AwaitingNode",
                         f"{name} on {decision.slot} waits for a node of pool {decision.pool}: its Pod selects the "
                         f"pool's label and requests the GPU, so the autoscaler adds the node (if it does not, check "
                         f"the NodePool's limits and the pool's selector in gpus.yaml){detail}"), False
        return _Cond("Ready", FALSE, "WorkloadNotAvailable", f"{name} is not available yet{detail}"), False
    if current is None:
        seen = f"it reports {verdict.mode}" if verdict else "no verdict yet"
        return _Cond("Ready", FALSE, "AwaitingWorker",
                     f"waiting for the worker on {decision.slot} to apply {decision.mode} ({seen})"), False
    return None


def _ready_and_degraded(ready: _Cond, degraded: bool) -> list[_Cond]:
    if degraded:
        return [ready, _Cond("Degraded", TRUE, ready.reason, ready.message)]
    if ready.status == TRUE:
        return [ready, _Cond("Degraded", FALSE, "Ready", "nothing to fix")]
    return [ready, _Cond("Degraded", FALSE, "Progressing", ready.message)]


def _slo(model: ElasticModel, decision: Decision | None) -> list[_Cond]:
    if not model.has_slo:
        return []
    if decision is None or decision.predicted is None or decision.slo_met is None:
        return [_Cond("SLOMet", UNKNOWN, "NotPredicted", "no prediction yet: the model has no placement")]
    predicted, slo = decision.predicted, model.slo
    parts = []
    if slo.ttft_ms is not None:
        parts.append(f"TTFT {predicted.ttft_ms:.1f} ms (SLO {slo.ttft_ms:g} ms)")
    if slo.tpot_ms is not None:
        parts.append(f"TPOT {predicted.tpot_ms:.1f} ms (SLO {slo.tpot_ms:g} ms)")
    numbers = "predicted " + ", ".join(parts)
    if decision.estimated:
        numbers += " from an estimated profile (not measured; a profiler Job measures it)"
        if decision.slo_met:  # an estimate alone never says a bare "met"
            return [_Cond("SLOMet", UNKNOWN, "MetByEstimate", numbers)]
    if decision.slo_met:
        return [_Cond("SLOMet", TRUE, "SLOMet", numbers)]
    return [_Cond("SLOMet", FALSE, "SLOMissed", f"{numbers} in {decision.mode} mode")]


def _rightsizing(model: ElasticModel) -> list[_Cond]:
    """The right-sizing loop's conditions, one type per concern, from its last record: UsageAvailable (False:
    UsageMissing), NeedsCapacity (True: the bytes missing and the GPU product), AtMaxBudget (True: a breach the
    policy's maxBudget caps). Unknown until the loop has read usage for the model."""
    if not model.rightsizing.enabled:
        return []
    found = {c.get("type"): c for c in model.rightsizing_conditions}
    usage = found.get("UsageAvailable")
    if usage is None:
        message = ("the right-sizing loop has not run for this model yet: the controller runs it every "
                   "--rightsize-interval when it has a Prometheus URL (PROMETHEUS_URL)")
        return [_Cond(kind, UNKNOWN, "NotObserved", message) for kind in ("UsageAvailable", "NeedsCapacity",
                                                                          "AtMaxBudget")]
    out = [_Cond("UsageAvailable", usage["status"], usage["reason"], usage["message"])]
    if usage["status"] != TRUE:
        message = f"no usage to judge it by: {usage['message']}"
        return out + [_Cond("NeedsCapacity", UNKNOWN, usage["reason"], message),
                      _Cond("AtMaxBudget", UNKNOWN, usage["reason"], message)]
    for kind, reason, message in (
            ("NeedsCapacity", "CapacityAvailable", "no budget the loop chose is waiting for GPU capacity"),
            ("AtMaxBudget", "BelowMaxBudget", "no breach is capped by spec.rightsizing.maxBudget")):
        cond = found.get(kind)
        out.append(_Cond(kind, cond["status"], cond["reason"], cond["message"]) if cond is not None
                   else _Cond(kind, FALSE, reason, message))
    return out


def _invalid_message(error: InputError) -> str:
    where = f"{error.file}" + (f" document {error.document}" if error.document is not None else "")
    return f"{where} {error.path}: {error.message}. Fix: {error.fix}"


def _short(revision: str | None) -> str:
    return revision[:7] if revision else "none"


def status_patch(model: ElasticModel, conditions: list[dict], decision: Decision | None,
                 url: str | None = None) -> dict:
    """The merge-patch body for the status subresource. `assigned: None` removes a stale decision, `url: None`
    the endpoint of a model that is no longer served. `rightsizing` (with a policy): the budgets and the open
    recommendation; its conditions are in `conditions`."""
    return {"status": {
        "observedGeneration": model.generation,
        "conditions": conditions,
        "assigned": assigned_patch(decision) if decision is not None else None,
        "url": url,
        "rightsizing": {"policy": model.rightsizing.policy, "specBudgetBytes": model.spec_budget_bytes,
                        "effectiveBudgetBytes": model.budget_bytes,
                        "recommendation": model.rightsizing_recommendation} if model.rightsizing.enabled else None,
    }}


def needs_write(current_status: dict | None, desired_status: dict) -> bool:
    """Whether merge-patching `desired_status` changes the stored status.

    Condition order is ignored; a null in the patch means "absent" (merge-patch deletes it),
    so a decision without predictions does not look changed on every pass.
    """
    current = current_status or {}
    for key, value in _without_nulls(desired_status).items():
        if key == "conditions":
            if _by_type(current.get("conditions")) != _by_type(value):
                return True
        elif current.get(key) != value:
            return True
    return any(value is None and current.get(key) is not None for key, value in desired_status.items())


def _without_nulls(value):
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _by_type(conditions: list[dict] | None) -> dict[str, dict]:
    return {c.get("type"): c for c in conditions or []}
