"""controller.observe.status: conditions from decisions and cluster observations, the status patch, write-if-changed."""
from __future__ import annotations

import dataclasses

import pytest

from controller.observe.status import (
    AppState, JobState, Observed, WorkerVerdict, WorkloadState, conditions_for, needs_write, status_patch,
)
from controller.policy import Rightsizing
from controller.types import SLO, Decision, ElasticModel, InputError, Pending, Predicted
from tests.kubedouble import merge_patch, stored_after_merge_patch as stored

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
COMMIT = "c0ffee1234567890"
MODEL = ElasticModel(name="chat", namespace="llm", model="org/chat", budget_bytes=4 << 30, generation=3)
SLO_MODEL = dataclasses.replace(MODEL, slo=SLO(ttft_ms=500, tpot_ms=50), has_slo=True)

RESIDENT = Decision(
    name="chat", namespace="llm", model="org/chat", gpu_product="NVIDIA-H200", slot="node-a/gpu0",
    mode="resident", resident_layers=24, total_layers=24, need_bytes=3 << 30, budget_bytes=4 << 30,
    footprint_bytes=3 << 30, predicted=Predicted(ttft_ms=120.0, tpot_ms=20.0), slo_met=True,
    reason="need 3.0Gi <= limit 4.0Gi", reason_code="FitsResident", profile="org/chat@NVIDIA-H200")
BELOW_MINIMUM = dataclasses.replace(
    RESIDENT, slot=None, mode="refused", predicted=None, slo_met=None, reason_code="BudgetBelowElasticMinimum",
    reason="even streaming every layer needs 1.2Gi on the GPU: raise memoryBudget to at least 1.2Gi")
NO_CAPACITY = dataclasses.replace(
    BELOW_MINIMUM, reason_code="NoCapacity", reason="needs 3.0Gi but the most any slot has left is 1.0Gi")
PENDING = Pending(name="chat", namespace="llm", model="org/chat", gpu_product="NVIDIA-H200", revision="main",
                  reason="no profile")
BAD_SPEC = InputError(file="models/chat.yaml", document=0, path="spec.mode", message="mode is not a spec field",
                      fix="delete spec.mode; the controller assigns it")

SYNCED_APP = AppState(name="gpushare-rendered", sync_status="Synced", revision="f00d" * 10, contains_commit=True,
                      health="Healthy", operation_phase="Succeeded")
AVAILABLE = WorkloadState(name="worker-node-a-gpu0", available=True)
APPLIED = WorkerVerdict(mode="resident", verdict="applied", slot="node-a/gpu0")
ALL_GOOD = Observed(commit=COMMIT, app=SYNCED_APP, workload=AVAILABLE, verdict=APPLIED)


def _cond(conditions: list[dict], type_: str) -> dict:
    [found] = [c for c in conditions if c["type"] == type_]
    return found


READY_CASES = [
    # id, decision, pending, error, observed, (Ready status, reason), degraded?, words the user reads
    ("all-good-is-ready", RESIDENT, None, None, ALL_GOOD, ("True", "Ready"), False,
     ["resident on node-a/gpu0", "c0ffee1"]),
    ("invalid-spec", None, None, BAD_SPEC, Observed(), ("False", "InvalidSpec"), True,
     ["models/chat.yaml", "spec.mode", "delete spec.mode"]),
    ("input-error-keeps-its-reason", None, None, dataclasses.replace(BAD_SPEC, reason="DuplicateModel"), Observed(),
     ("False", "DuplicateModel"), True, ["models/chat.yaml"]),
    ("profile-job-running", None, PENDING, None,
     Observed(commit=COMMIT, job=JobState(name="profile-chat-abc", phase="Running")),
     ("False", "AwaitingProfile"), False, ["profile-chat-abc is running"]),
    ("profile-job-failed", None, PENDING, None,
     Observed(commit=COMMIT, job=JobState(name="profile-chat-abc", phase="Failed",
                                          message="model org/chat not found in the cache")),
     ("False", "ProfileFailed"), True, ["profile-chat-abc failed", "model org/chat not found in the cache"]),
    ("budget-below-elastic-minimum", BELOW_MINIMUM, None, None, ALL_GOOD,
     ("False", "BudgetBelowElasticMinimum"), True, ["raise memoryBudget to at least 1.2Gi"]),
    ("no-capacity", NO_CAPACITY, None, None, ALL_GOOD, ("False", "NoCapacity"), True, ["most any slot has left"]),
    ("not-committed", RESIDENT, None, None, dataclasses.replace(ALL_GOOD, commit=None),
     ("False", "NotCommitted"), False, ["nothing committed"]),
    ("application-missing", RESIDENT, None, None, dataclasses.replace(ALL_GOOD, app=None),
     ("False", "ApplicationNotFound"), False, ["Application that syncs it was not found"]),
    ("synced-an-older-revision", RESIDENT, None, None,
     dataclasses.replace(ALL_GOOD, app=dataclasses.replace(SYNCED_APP, contains_commit=False)),
     ("False", "SyncPending"), False, ["waiting for it to sync commit c0ffee1"]),
    ("out-of-sync", RESIDENT, None, None,
     dataclasses.replace(ALL_GOOD, app=dataclasses.replace(SYNCED_APP, sync_status="OutOfSync")),
     ("False", "SyncPending"), False, ["is OutOfSync"]),
    ("sync-failed", RESIDENT, None, None,
     dataclasses.replace(ALL_GOOD, app=dataclasses.replace(
         SYNCED_APP, sync_status="OutOfSync", operation_phase="Failed",
         operation_message="one or more objects failed to apply: Deployment.apps is invalid")),
     ("False", "SyncFailed"), True, ["failed to sync (Failed)", "Deployment.apps is invalid"]),
    ("worker-refused", RESIDENT, None, None,
     dataclasses.replace(ALL_GOOD, verdict=WorkerVerdict(
         mode="resident", verdict="refused", slot="node-a/gpu0", reason="InsufficientMemory",
         message="CUDA has 2.0Gi free",
         need_bytes=3 << 30, available_bytes=2 << 30, missing_bytes=1 << 30)),
     ("False", "WorkerRefused"), True, ["needs 3.0Gi", "2.0Gi available", "1.0Gi missing", "InsufficientMemory"]),
    ("stale-refusal-for-another-mode-waits", RESIDENT, None, None,
     dataclasses.replace(ALL_GOOD, verdict=WorkerVerdict(mode="swap", verdict="refused", slot="node-a/gpu0")),
     ("False", "AwaitingWorker"), False, ["it reports swap"]),
    ("applied-on-the-previous-slot-is-no-verdict", RESIDENT, None, None,
     dataclasses.replace(ALL_GOOD, verdict=dataclasses.replace(APPLIED, slot="node-b/gpu1")),
     ("False", "AwaitingWorker"), False, ["no verdict yet"]),
    ("refused-on-the-previous-slot-is-no-verdict", RESIDENT, None, None,
     dataclasses.replace(ALL_GOOD, verdict=WorkerVerdict(mode="resident", verdict="refused", slot="node-b/gpu1")),
     ("False", "AwaitingWorker"), False, ["no verdict yet"]),
    ("deployment-not-available", RESIDENT, None, None,
     dataclasses.replace(ALL_GOOD, workload=WorkloadState(name="worker-node-a-gpu0", available=False,
                                                          message="0/1 replicas available")),
     ("False", "WorkloadNotAvailable"), False, ["worker-node-a-gpu0", "0/1 replicas available"]),
    ("deployment-missing", RESIDENT, None, None, dataclasses.replace(ALL_GOOD, workload=None),
     ("False", "WorkloadNotAvailable"), False, ["the worker Deployment"]),
    ("no-verdict-yet", RESIDENT, None, None, dataclasses.replace(ALL_GOOD, verdict=None),
     ("False", "AwaitingWorker"), False, ["no verdict yet"]),
]


@pytest.mark.parametrize("decision,pending,error,observed,ready,degraded,words",
                         [c[1:] for c in READY_CASES], ids=[c[0] for c in READY_CASES])
def test_ready_and_degraded(decision, pending, error, observed, ready, degraded, words):
    conditions = conditions_for(MODEL, decision, pending, error, observed, [], T0)
    got = _cond(conditions, "Ready")
    assert (got["status"], got["reason"]) == ready
    assert _cond(conditions, "Degraded")["status"] == ("True" if degraded else "False")
    for word in words:
        assert word in got["message"]


STAGE_CASES = [
    # id, decision, pending, error, observed, {type: (status, reason)}
    ("planned-and-synced", RESIDENT, None, None, ALL_GOOD,
     {"Profiled": ("True", "ProfileFound"), "Assigned": ("True", "FitsResident"), "Synced": ("True", "Synced")}),
    ("awaiting-profile", None, PENDING, None, Observed(),
     {"Profiled": ("False", "Profiling"), "Assigned": ("False", "AwaitingProfile"),
      "Synced": ("False", "NotCommitted")}),
    ("refused-keeps-profile", BELOW_MINIMUM, None, None, ALL_GOOD,
     {"Profiled": ("True", "ProfileFound"), "Assigned": ("False", "BudgetBelowElasticMinimum")}),
    ("invalid-spec-blocks-all", None, None, BAD_SPEC, Observed(),
     {"Profiled": ("Unknown", "InvalidSpec"), "Assigned": ("False", "InvalidSpec"),
      "Synced": ("Unknown", "InvalidSpec")}),
]


@pytest.mark.parametrize("decision,pending,error,observed,expected",
                         [c[1:] for c in STAGE_CASES], ids=[c[0] for c in STAGE_CASES])
def test_stage_conditions(decision, pending, error, observed, expected):
    conditions = conditions_for(MODEL, decision, pending, error, observed, [], T0)
    for type_, (status, reason) in expected.items():
        assert (_cond(conditions, type_)["status"], _cond(conditions, type_)["reason"]) == (status, reason), type_


def test_conditions_have_the_metav1_shape_in_a_stable_order():
    conditions = conditions_for(MODEL, RESIDENT, None, None, ALL_GOOD, [], T0)
    assert [c["type"] for c in conditions] == ["Profiled", "Assigned", "Synced", "Ready", "Degraded"]
    for c in conditions:
        assert set(c) == {"type", "status", "reason", "message", "observedGeneration", "lastTransitionTime"}
        assert c["status"] in ("True", "False", "Unknown") and c["reason"].isalnum() and c["reason"][0].isupper()
        assert c["observedGeneration"] == 3


SLO_CASES = [
    ("met", RESIDENT, ("True", "SLOMet"), ["TTFT 120.0 ms (SLO 500 ms)", "TPOT 20.0 ms (SLO 50 ms)"]),
    ("missed", dataclasses.replace(RESIDENT, mode="swap", slo_met=False, predicted=Predicted(900.0, 20.0, 700.0)),
     ("False", "SLOMissed"), ["TTFT 900.0 ms (SLO 500 ms)", "swap mode"]),
    ("refused-has-no-prediction", BELOW_MINIMUM, ("Unknown", "NotPredicted"), ["no prediction"]),
    ("met-by-an-estimate-is-never-a-bare-met", dataclasses.replace(RESIDENT, estimated=True),
     ("Unknown", "MetByEstimate"), ["TPOT 20.0 ms (SLO 50 ms)", "estimated profile (not measured"]),
    ("missed-by-an-estimate-says-so", dataclasses.replace(RESIDENT, estimated=True, slo_met=False),
     ("False", "SLOMissed"), ["from an estimated profile"]),
]


@pytest.mark.parametrize("decision,expected,words", [c[1:] for c in SLO_CASES], ids=[c[0] for c in SLO_CASES])
def test_slo_condition_carries_both_numbers(decision, expected, words):
    conditions = conditions_for(SLO_MODEL, decision, None, None, ALL_GOOD, [], T0)
    slo = _cond(conditions, "SLOMet")
    assert (slo["status"], slo["reason"]) == expected
    for word in words:
        assert word in slo["message"]


def test_no_slo_condition_without_an_slo():
    assert "SLOMet" not in {c["type"] for c in conditions_for(MODEL, RESIDENT, None, None, ALL_GOOD, [], T0)}


TRANSITION_CASES = [
    # id, first observed, second observed, does Ready's lastTransitionTime move?
    ("same-status-new-reason-keeps-time", dataclasses.replace(ALL_GOOD, verdict=None),
     dataclasses.replace(ALL_GOOD, workload=None), False),
    ("flip-to-true-moves-time", dataclasses.replace(ALL_GOOD, verdict=None), ALL_GOOD, True),
    ("unchanged-keeps-time", ALL_GOOD, ALL_GOOD, False),
]


@pytest.mark.parametrize("first,second,moves", [c[1:] for c in TRANSITION_CASES],
                         ids=[c[0] for c in TRANSITION_CASES])
def test_last_transition_time_moves_only_on_a_flip(first, second, moves):
    before = conditions_for(MODEL, RESIDENT, None, None, first, [], T0)
    after = conditions_for(MODEL, RESIDENT, None, None, second, before, T1)
    assert _cond(after, "Ready")["lastTransitionTime"] == (T1 if moves else T0)
    assert _cond(after, "Assigned")["lastTransitionTime"] == T0  # Assigned never flipped


def test_status_patch_body_and_assigned_removal():
    conditions = conditions_for(MODEL, RESIDENT, None, None, ALL_GOOD, [], T0)
    body = status_patch(MODEL, conditions, RESIDENT)
    assert set(body) == {"status"}
    assert body["status"]["observedGeneration"] == 3
    assert body["status"]["assigned"]["mode"] == "resident"
    assert body["status"]["assigned"]["gpu"] == {"product": "NVIDIA-H200", "slot": "node-a/gpu0", "pool": None}
    # merge-patch null deletes a decision that no longer exists (e.g. awaiting a new profile)
    assert status_patch(MODEL, conditions, None)["status"]["assigned"] is None
    # the endpoint of a placed model, and null (delete) for one that is no longer served
    assert status_patch(MODEL, conditions, RESIDENT, "http://chat.llm.svc/v1")["status"]["url"] == "http://chat.llm.svc/v1"
    assert status_patch(MODEL, conditions, None)["status"]["url"] is None


def _desired(observed=ALL_GOOD, decision=RESIDENT, previous=()):
    return status_patch(MODEL, conditions_for(MODEL, decision, None, None, observed, list(previous), T1),
                        decision)["status"]


NEEDS_WRITE_CASES = [
    ("nothing-stored-yet", lambda d: None, True),
    ("identical", lambda d: dict(d), False),
    ("conditions-reordered", lambda d: dict(d, conditions=list(reversed(d["conditions"]))), False),
    ("stale-generation", lambda d: dict(d, observedGeneration=2), True),
    ("condition-message-changed", lambda d: dict(d, conditions=[dict(c, message="old") for c in d["conditions"]]),
     True),
    ("assigned-absent-and-desired-null", None, False),
    ("stored-decision-to-remove", "stored-assigned", True),
    ("nulls-inside-the-decision-are-absent-when-stored", "stored-without-nulls", False),
]


@pytest.mark.parametrize("make_current,expected", [c[1:] for c in NEEDS_WRITE_CASES],
                         ids=[c[0] for c in NEEDS_WRITE_CASES])
def test_needs_write(make_current, expected):
    if make_current is None:  # a model with no decision: desired says assigned=null, the store has none
        desired = _desired(decision=None, observed=Observed())
        current = {k: v for k, v in desired.items() if k not in ("assigned", "url")}  # the store keeps no nulls
    elif make_current == "stored-assigned":  # the decision went away (new profile needed): remove it
        desired = _desired(decision=None, observed=Observed())
        current = dict(desired, assigned={"mode": "resident"})
    elif make_current == "stored-without-nulls":  # the API server stores no nulls from a merge patch
        desired = _desired(decision=BELOW_MINIMUM)
        assert desired["assigned"]["predicted"] is None
        current = stored(desired)
    else:
        desired = _desired()
        current = make_current(stored(desired))
    assert needs_write(current, desired) is expected


def test_a_second_pass_with_nothing_new_writes_nothing():
    first = _desired()
    second = _desired(previous=first["conditions"])
    assert not needs_write(stored(first), second)


RS_MODEL = dataclasses.replace(MODEL, rightsizing=Rightsizing(policy="Recommend"))
USAGE_READ = {"type": "UsageAvailable", "status": "True", "reason": "UsageRead", "message": "usage read over the window"}
USAGE_MISSING = {"type": "UsageAvailable", "status": "False", "reason": "UsageMissing",
                 "message": "usage could not be read; no change made"}
NEEDS_CAPACITY = {"type": "NeedsCapacity", "status": "True", "reason": "NeedsCapacity",
                  "message": "no NVIDIA-H200 slot has room for 9.0Gi: 2.0Gi missing on NVIDIA-H200"}
AT_MAX = {"type": "AtMaxBudget", "status": "True", "reason": "AtMaxBudget",
          "message": "KvNearReservation but the budget is at maxBudget"}

RIGHTSIZING_CASES = [
    # id, the record's conditions (None: no record yet), {type: (status, reason)}, words in NeedsCapacity's message
    ("no-record-yet-is-unknown", None,
     {"UsageAvailable": ("Unknown", "NotObserved"), "NeedsCapacity": ("Unknown", "NotObserved"),
      "AtMaxBudget": ("Unknown", "NotObserved")}, ["PROMETHEUS_URL"]),
    ("usage-missing-makes-the-rest-unknown", (USAGE_MISSING,),
     {"UsageAvailable": ("False", "UsageMissing"), "NeedsCapacity": ("Unknown", "UsageMissing"),
      "AtMaxBudget": ("Unknown", "UsageMissing")}, ["usage could not be read"]),
    ("usage-read-and-nothing-wrong-is-false", (USAGE_READ,),
     {"UsageAvailable": ("True", "UsageRead"), "NeedsCapacity": ("False", "CapacityAvailable"),
      "AtMaxBudget": ("False", "BelowMaxBudget")}, ["waiting for GPU capacity"]),
    ("needs-capacity-names-bytes-and-product", (USAGE_READ, NEEDS_CAPACITY),
     {"UsageAvailable": ("True", "UsageRead"), "NeedsCapacity": ("True", "NeedsCapacity"),
      "AtMaxBudget": ("False", "BelowMaxBudget")}, ["2.0Gi missing", "NVIDIA-H200"]),
    ("at-max-budget", (USAGE_READ, AT_MAX),
     {"NeedsCapacity": ("False", "CapacityAvailable"), "AtMaxBudget": ("True", "AtMaxBudget")}, []),
]


@pytest.mark.parametrize("record,expected,words", [c[1:] for c in RIGHTSIZING_CASES],
                         ids=[c[0] for c in RIGHTSIZING_CASES])
def test_rightsizing_conditions_live_in_status_conditions_and_never_touch_ready(record, expected, words):
    model = RS_MODEL if record is None else dataclasses.replace(RS_MODEL, rightsizing_conditions=record)
    conditions = conditions_for(model, RESIDENT, None, None, ALL_GOOD, [], T0)
    for type_, (status, reason) in expected.items():
        assert (_cond(conditions, type_)["status"], _cond(conditions, type_)["reason"]) == (status, reason), type_
    for word in words:
        assert word in _cond(conditions, "NeedsCapacity")["message"]
    assert [c["type"] for c in conditions][-3:] == ["UsageAvailable", "NeedsCapacity", "AtMaxBudget"]
    assert (_cond(conditions, "Ready")["status"], _cond(conditions, "Degraded")["status"]) == ("True", "False")
    assert all(c["observedGeneration"] == 3 for c in conditions)
    assert "conditions" not in (status_patch(model, conditions, RESIDENT)["status"]["rightsizing"] or {})


def test_rightsizing_conditions_keep_their_transition_time_until_they_flip():
    missing = dataclasses.replace(RS_MODEL, rightsizing_conditions=(USAGE_MISSING,))
    read = dataclasses.replace(RS_MODEL, rightsizing_conditions=(USAGE_READ,))
    first = conditions_for(missing, RESIDENT, None, None, ALL_GOOD, [], T0)
    same = conditions_for(missing, RESIDENT, None, None, ALL_GOOD, first, T1)
    flipped = conditions_for(read, RESIDENT, None, None, ALL_GOOD, same, T1)
    assert _cond(same, "UsageAvailable")["lastTransitionTime"] == T0
    assert _cond(flipped, "UsageAvailable")["lastTransitionTime"] == T1
    assert not needs_write(stored(status_patch(missing, first, RESIDENT))["status"],
                           status_patch(missing, same, RESIDENT)["status"])


def test_no_rightsizing_conditions_without_a_policy():
    types = {c["type"] for c in conditions_for(MODEL, RESIDENT, None, None, ALL_GOOD, [], T0)}
    assert not types & {"UsageAvailable", "NeedsCapacity", "AtMaxBudget"}


@pytest.mark.parametrize("before, after, gone", [
    pytest.param(dataclasses.replace(RESIDENT, slot="pool-l4-0/gpu0", pool="l4"), RESIDENT, ("gpu", "pool"),
                 id="moved-off-a-pool-node-keeps-no-stale-pool"),
    pytest.param(dataclasses.replace(RESIDENT, weight_dtype="int8"), RESIDENT, ("weightDtype",),
                 id="back-to-auto-keeps-no-stale-weight-dtype"),
])
def test_status_assigned_merge_patch_deletes_what_the_new_decision_lacks(before, after, gone):
    conditions = conditions_for(MODEL, RESIDENT, None, None, ALL_GOOD, [], T0)
    first = merge_patch({}, status_patch(MODEL, conditions, before)["status"])
    assert _dig(first["assigned"], gone) is not None
    second = merge_patch(first, status_patch(MODEL, conditions, after)["status"])
    assert _dig(second["assigned"], gone) is None


def _dig(doc: dict, path: tuple[str, ...]):
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc
