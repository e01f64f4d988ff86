"""One right-sizing step, pure: models, their decisions and usage in; records and proposals out.

For each model whose policy is not Off, the recommender replays the usage window from
the budget in force (Auto: the effective budget of its record; Recommend: the user's),
the last change an earlier step made acting as history. A new budget becomes:
- Recommend: a `Proposal` (the edit of the user's file on the review branch) and an open record;
- Auto: a record whose budget the next pass plans with, unless it does not fit anywhere
  (NeedsCapacity: the record keeps the old budget and says how many bytes the plan lacks to place it).
Usage that cannot be read (Prometheus down) or a model with no usage in the window changes
nothing and sets the condition UsageMissing; a gap at the end of the window, or a hole in the
span a downsize needs, sets it too while the changes the usage before it shows still apply (a
replay over the same samples takes them: the loop and the replay decide alike). Holds land in
conditions by kind (Hold.kind: MemoryWontHelp with the signal's reason, AtMaxBudget, ...). With usage and the model's profile, each record also
carries the KV-cache reservation the loop recommends (controller.rightsizing.kv). Called by
`gpushare rightsize` and the controller.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from contract.quantity import format_bytes
from controller.planning.cost import elastic_slice_at
from controller.planning.occupancy import device_bytes
from controller.planning.plan import plan
from controller.types import Decision, ElasticModel, GpuSlot, Inputs, Profile

from .bounds import limits_for
from .kv import KvReservation, recommend_kv
from .placement import Fit, where_it_fits
from controller.policy import DEFAULT_WINDOW_S, PERCENTILE
from .recommender import Change, Hold, Recommender, Slo, grid_of, replay
from .window import GAP_INTERVALS, words
from controller.inputs.rightsizing_records import Condition, Record
from .usage import Sample, format_time, parse_time

HOURS_PER_MONTH = 730
HOLD_CONDITIONS = ("AtMaxBudget", "MemoryWontHelp", "WouldBeRefused", "ChangeCapReached")  # each a condition type


@dataclass(frozen=True)
class Proposal:
    """Recommend: set `model`'s spec.memoryBudget to `budget_bytes` on `branch`, with `message`. `new`: this
    step made it (a pull request may be opened for it); False for an open proposal carried to a new base."""

    model: ElasticModel
    budget_bytes: int
    branch: str
    message: str
    new: bool = True


@dataclass(frozen=True)
class StepResult:
    records: dict[tuple[str, str], Record]
    proposals: tuple[Proposal, ...]


def review_branch(model: ElasticModel) -> str:
    return f"gpushare/rightsize-{model.namespace}-{model.name}"


def monthly_cost(delta_bytes: int, slot: GpuSlot | None, prices: Mapping[str, float]) -> float | None:
    """The monthly cost of `delta_bytes` more (negative: less) of a GPU of the slot's product."""
    if slot is None or slot.product not in prices or slot.memory_bytes <= 0:
        return None
    return delta_bytes / slot.memory_bytes * prices[slot.product] * HOURS_PER_MONTH


def step(models: Sequence[ElasticModel], decisions: Sequence[Decision], slots: Sequence[GpuSlot],
         records: Mapping[tuple[str, str], Record], usage: Mapping[str, Sequence[Sample]] | None, now: float,
         prices: Mapping[str, float] | None = None, profiles: Sequence[Profile] = (),
         held: Mapping[str, tuple[str, str]] | None = None,
         bad_records: Mapping[tuple[str, str], str] | None = None, *, window_s: float = DEFAULT_WINDOW_S,
         step_s: float | None = None, history_until: float | None = None,
         acts_after: float | None = None) -> StepResult:
    """`usage` None: no usage could be read at all (every enabled model holds). `profiles` size a KV sequence
    (none: no KV reservation is recommended). `held`: namespace/name -> (reason, message) of models whose usage
    could not be trusted (they hold, with that reason). `bad_records`: (namespace, name) -> what is wrong with the
    model's record file: that model holds (InvalidRecord) and gets a fresh record. `window_s`: the loop's window;
    `step_s`: the grid the usage was read on (None: each series' smallest spacing); `history_until`, `acts_after`:
    the samples up to the first are slot peaks, and up to the second only feed the window (a pass's read,
    controller.rightsizing.prometheus.Usage; None: a whole series, every sample may act)."""
    by_key = {d.key: d for d in decisions}
    by_profile = {p.key: p for p in profiles}
    out: dict[tuple[str, str], Record] = {}
    proposals = []
    replays = {}
    for model, carried, in_force, samples in _replayable(models, records, usage, held, bad_records, now):
        decision = by_key.get(model.key)
        limits = limits_for(model, model.rightsizing, decision, slots, profile_of(model, decision, by_profile))
        events, loop = replay(samples, model.ref, in_force, model.rightsizing, Slo(model.slo.ttft_ms, model.slo.tpot_ms),
                              parse_time(carried.at) if carried and carried.at else None, limits,
                              (parse_time(t) for t in (carried.recent if carried else ())), window_s,
                              step_s=step_s, history_until=history_until, acts_after=acts_after)
        replays[model.key] = Replayed.of(events, loop, samples, now, step_s)  # the loop itself is let go
    moved = {m.key: replays[m.key].budget for m in models if m.key in replays
             and any(isinstance(e, Change) for e in replays[m.key].events) and replays[m.key].budget != m.budget_bytes}
    fits = planned_fits(models, moved, by_key, slots, profiles)
    for model in sorted(models, key=lambda m: m.key):
        policy = model.rightsizing
        if not policy.enabled:
            continue
        if model.key in (bad_records or {}):
            user = model.spec_budget_bytes
            out[model.key] = Record(model.namespace, model.name, policy.policy, user, user, conditions=(
                Condition("RecordValid", "False", "InvalidRecord", f"{bad_records[model.key]}; the model holds this "
                          "pass and its record is rewritten"),))
            continue
        user = model.spec_budget_bytes
        carried = _carried(model, records.get(model.key))  # a merged proposal is closed, its time stays
        in_force = carried.budget_bytes if carried and policy.policy == "Auto" else user
        base = carried or Record(model.namespace, model.name, policy.policy, user, in_force)
        if model.key not in replays:  # no usage it can act on: it holds
            samples = list((usage or {}).get(model.ref, ()))
            reason, missing = (held or {}).get(model.ref) or (
                "UsageMissing", _missing(samples, now, step_s) if usage is not None else "usage could not be read")
            out[model.key] = replace(base, conditions=(Condition("UsageAvailable", "False", reason,
                                                                 f"{missing}; no change made"),))
            continue
        decision = by_key.get(model.key)
        loop = replays[model.key]
        found = loop.events
        change = next((e for e in reversed(found) if isinstance(e, Change)), None)
        recent = tuple(format_time(t) for t in loop.recent)
        kv = _kv(model, decision, by_profile, loop)
        kv_doc = kv.as_dict() if kv is not None else base.kv
        conditions = [loop.usage]
        for kind in HOLD_CONDITIONS:
            holds = [e for e in found if isinstance(e, Hold) and e.kind == kind]
            if holds and (change is None or holds[-1].at > change.at):
                conditions.append(Condition(kind, "True", holds[-1].reason, holds[-1].message))
        if change is None or loop.budget in (in_force, base.budget_bytes):  # nothing new: records stay as they are
            out[model.key] = replace(base, conditions=tuple(conditions), kv=kv_doc)
            if carried is not None and carried.open and policy.policy == "Recommend":
                proposals.append(Proposal(model, carried.budget_bytes, review_branch(model),
                                          _reproposal_message(model, carried), new=False))
            continue
        fit = fits.get(model.key) or (where_it_fits(decision, loop.budget, decisions, slots)
                                      if decision is not None else None)
        if fit is not None and fit.kind == "NeedsCapacity":
            conditions.append(Condition("NeedsCapacity", "True", "NeedsCapacity", fit.message))
            if policy.policy == "Auto":
                out[model.key] = replace(base, conditions=tuple(conditions), fit=_fit_dict(fit), kv=kv_doc)
                continue
        record = Record(model.namespace, model.name, policy.policy, user, loop.budget,
                        change.direction, change.reason, format_time(change.at), change.evidence.as_dict(),
                        _fit_dict(fit) if fit else {},
                        review_branch(model) if policy.policy == "Recommend" else None, tuple(conditions), kv_doc,
                        recent)
        out[model.key] = record
        if policy.policy == "Recommend":
            slot = next((s for s in slots if decision is not None and s.id == decision.slot), None)
            proposals.append(Proposal(model, loop.budget, review_branch(model),
                                      proposal_message(model, in_force, change, fit, slot, prices or {}, kv)))
    return StepResult(out, tuple(proposals))


def _replayable(models, records, usage, held, bad_records, now):
    """(model, carried record, budget in force, samples) of each model the step replays: a policy, a good
    record or none, and usage it can trust with some usage in it."""
    for model in models:
        policy = model.rightsizing
        if not policy.enabled or model.key in (bad_records or {}):
            continue
        carried = _carried(model, records.get(model.key))
        in_force = carried.budget_bytes if carried and policy.policy == "Auto" else model.spec_budget_bytes
        samples = list((usage or {}).get(model.ref, ()))
        if usage is None or model.ref in (held or {}) or all(s.missing for s in samples):
            continue
        yield model, carried, in_force, samples


def _carried(model: ElasticModel, previous: Record | None) -> Record | None:
    """The previous record when it still applies: same policy, same user budget (or a merged proposal)."""
    policy, user = model.rightsizing, model.spec_budget_bytes
    if previous is None or previous.policy != policy.policy:
        return None
    if previous.spec_budget_bytes == user:
        return previous
    if policy.policy == "Recommend" and previous.budget_bytes == user:  # the user merged the proposal
        return replace(previous, spec_budget_bytes=user)
    return None


def planned_fits(models: Sequence[ElasticModel], budgets: Mapping[tuple[str, str], int],
                 previous: Mapping[tuple[str, str], Decision], slots: Sequence[GpuSlot],
                 profiles: Sequence[Profile]) -> dict[tuple[str, str], Fit]:
    """Where each new budget lands in the next plan: the planner itself (controller.planning.plan) over the
    whole fleet with every new budget at once, from the last decisions, so a record's verdict is what the
    next reconcile pass does. Models the planner cannot place without a profile are left out (the caller
    falls back to where_it_fits)."""
    if not budgets or not slots or not profiles:
        return {}
    fleet = tuple(replace(m, budget_bytes=budgets.get(m.key, m.budget_bytes)) for m in models)
    planned = {d.key: d for d in plan(Inputs(fleet, tuple(profiles), tuple(slots)), previous).decisions}
    by_profile = {p.key: p for p in profiles}
    fits = {}
    for key, budget in budgets.items():
        new, old = planned.get(key), previous.get(key)
        if new is None:
            continue
        product = new.gpu_product
        if new.mode == "refused" or new.slot is None:
            model = next(m for m in fleet if m.key == key)
            profile = by_profile.get(model.profile_key(product))
            missing = shortfall(model, profile, planned.values(), slots) if profile is not None else 0
            fits[key] = Fit("NeedsCapacity", None, missing, product,
                            f"the next plan refuses it at {format_bytes(budget)}: {new.reason}")
            continue
        granted = min(new.need_bytes, budget)
        squeezed = f" of the {format_bytes(granted)} granted" if new.footprint_bytes < granted else ""
        where = f"{new.mode} at {format_bytes(new.footprint_bytes)}{squeezed}"
        if old is not None and old.slot == new.slot:
            fits[key] = Fit("InPlace", new.slot, 0, product, f"the next plan keeps it on {new.slot}, {where}")
        else:
            fits[key] = Fit("Move", new.slot, 0, product, f"the next plan moves it to {new.slot}, {where}")
    return fits


def shortfall(model: ElasticModel, profile: Profile, planned: Iterable[Decision], slots: Sequence[GpuSlot]) -> int:
    """The bytes a plan that refused `model` lacks to place it at all: its elastic minimum (every layer streamed)
    beyond the most room a slot of the profile's product has left in that plan (the planner's own "Missing"
    figure; 0 when the room was there and something else refused it: the plan's reason says what)."""
    placed = tuple(planned)
    rooms = [s.usable_bytes - device_bytes(d for d in placed if d.slot == s.id) for s in slots
             if s.product == profile.gpu_product]
    return max(0, elastic_slice_at(profile, model.slo, 0).footprint - max(rooms, default=0))


def profile_of(model: ElasticModel, decision: Decision | None,
             profiles: Mapping[tuple[str, str, str, str], Profile]) -> Profile | None:
    """The model's profile on the GPU product it is placed on (or asks for)."""
    product = decision.gpu_product if decision is not None else model.gpu_product
    return profiles.get(model.profile_key(product)) if product else None


@dataclass(frozen=True)
class Replayed:
    """What the step keeps of one model's replay (a fleet's recommenders are not held at once): its events, the
    budget and change times it ended with, its KV in use (percentile, peak; None: never reported) and its
    UsageAvailable condition."""

    events: tuple
    budget: int
    recent: tuple[float, ...]
    kv_used: tuple[int | None, int] | None
    usage: Condition

    @classmethod
    def of(cls, events, loop: Recommender, samples: Sequence[Sample], now: float, step_s: float | None) -> Replayed:
        kv = (loop.window.kv.percentile(PERCENTILE), loop.kv_peak) if loop.kv_seen else None
        return cls(tuple(events), loop.budget, tuple(loop.recent), kv, _usage_condition(loop, samples, now, step_s))


def _kv(model: ElasticModel, decision: Decision | None, profiles: Mapping[tuple[str, str, str, str], Profile],
        loop: Replayed) -> KvReservation | None:
    """The KV reservation to recommend from the loop's KV in use, sized by the model's profile on its GPU."""
    profile = profile_of(model, decision, profiles)
    if profile is None or loop.kv_used is None:
        return None
    return recommend_kv(used_percentile_bytes=loop.kv_used[0],
                        used_peak_bytes=loop.kv_used[1], headroom_percent=model.rightsizing.headroom_percent,
                        kv_bytes_per_token=profile.kv_bytes_per_token, context_tokens=model.slo.context_tokens,
                        concurrency=model.slo.concurrency,
                        slo_concurrency=model.slo.concurrency if model.has_slo else None)


def kv_line(kv: dict) -> str:
    """The KV reservation recommendation in words (a record's `kvReservation`), for commit messages."""
    sequences, context = kv["sequences"], kv["contextTokens"]
    verb = {"grow": "grow it to", "shrink": "shrink it to", "keep": "keep"}[kv["change"]]
    shorter = context < kv.get("reservedContextTokens", context)
    apply = f"set spec.slo.contextTokens to {context}" if shorter else f"set spec.slo.concurrency to {sequences}"
    return (f"KV reservation: {format_bytes(kv['reservedBytes'])} reserved; recommended: {verb} "
            f"{format_bytes(kv['recommendedBytes'])} ({sequences} sequence{'s' if sequences != 1 else ''} of "
            f"{context} tokens): the KV cache in use plus headroom, never below {kv['floor']}. This branch edits "
            f"memoryBudget only: {apply} to apply it.")


def _reproposal_message(model: ElasticModel, record: Record) -> str:
    """An open proposal carried to a new base (the tracked branch moved): the evidence it was made with."""
    evidence = ", ".join(f"{k} {v}" for k, v in sorted(record.evidence.items()))
    kv = f"{kv_line(record.kv)}\n" if record.kv else ""
    return (f"{model.ref}: memoryBudget {format_bytes(record.spec_budget_bytes)} → "
            f"{format_bytes(record.budget_bytes)} (right-sizing: {record.reason}, proposed {record.at})\n\n"
            f"Evidence: {evidence}.\n{kv}")


def _usage_condition(loop: Recommender, samples: Sequence[Sample], now: float, step_s: float | None) -> Condition:
    """UsageAvailable: False (UsageMissing) when usage stopped before the window's end, or a hole lies in the span
    a downsize needs; True otherwise, saying how much the window holds."""
    missing = _missing(samples, now, step_s)
    if missing:
        return Condition("UsageAvailable", "False", "UsageMissing", f"{missing}; only the usage before it counts")
    holes = loop.holes()
    if holes:
        return Condition("UsageAvailable", "False", "UsageMissing", holes)
    since = loop.window.covered_since
    wait = "" if since is None or loop.window.covered_for(loop.last_at or now) >= loop.span_s else (
        f"; downsizes wait until it holds {words(loop.span_s)} of usage, at {format_time(since + loop.span_s)}")
    return Condition("UsageAvailable", "True", "UsageRead", f"usage read over the window{wait}")


def _missing(samples: Sequence[Sample], now: float, step_s: float | None = None) -> str | None:
    """Why the series cannot be trusted at its end, or None."""
    present = [s for s in samples if not s.missing]
    if not present:
        return "no usage samples in the window"
    if samples[-1].missing:
        return f"usage missing since {format_time(present[-1].time)}"
    interval = step_s or grid_of(samples)
    last = samples[-1].time
    if interval is not None and now - last > GAP_INTERVALS * interval:
        return f"no usage since {format_time(last)}"  # not how long ago: the record stays the same pass after pass
    return None


def _fit_dict(fit: Fit) -> dict:
    out = {"kind": fit.kind, "message": fit.message}
    if fit.slot:
        out["slot"] = fit.slot
    if fit.kind == "NeedsCapacity":
        out.update(missingBytes=fit.missing_bytes, product=fit.product)
    return out


def proposal_message(model: ElasticModel, budget: int, change: Change, fit: Fit | None, slot: GpuSlot | None,
                     prices: Mapping[str, float], kv: KvReservation | None = None) -> str:
    """The review commit's message: the change, then the evidence it rests on."""
    e = change.evidence
    delta = change.to_bytes - budget
    lines = [f"{model.ref}: memoryBudget {format_bytes(budget)} → {format_bytes(change.to_bytes)} "
             f"(right-sizing: {change.reason})", "",
             f"Window: {e.window_s / 3600:.1f}h of usage ({e.samples} samples, decaying histogram, "
             f"half-life {e.half_life_s / 3600:.0f}h), up to {format_time(change.at)}.",
             f"Device bytes: p{e.percentile * 100:g} {format_bytes(e.percentile_bytes)}, peak "
             f"{format_bytes(e.peak_bytes)}; headroom {e.headroom_percent:g}%.",
             f"Breaches: {', '.join(e.breaches) if e.breaches else 'none'}"
             + (f" (since {format_time(e.breach_since)})" if e.breach_since else "") + "."]
    if e.kv_used_peak_bytes is not None:
        reserved = f" of {format_bytes(e.kv_reserved_bytes)} reserved" if e.kv_reserved_bytes is not None else ""
        lines.append(f"KV cache in use: p{e.percentile * 100:g} {format_bytes(e.kv_used_p99_bytes)}, peak "
                     f"{format_bytes(e.kv_used_peak_bytes)}{reserved}; headroom applies to it.")
    if kv is not None:
        lines.append(kv_line(kv.as_dict()))
    lines.append(f"{'Frees' if delta < 0 else 'Needs'} {format_bytes(abs(delta))}"
                 + (f"; {fit.message}." if fit else "."))
    cost = monthly_cost(delta, slot, prices)
    if cost is not None:
        lines.append(f"Monthly cost effect: {cost:+.2f} per month at {prices[slot.product]:g} per "
                     f"{slot.product} GPU-hour.")
    lines += ["", "Merge this branch to apply the budget, or close it to keep yours; the loop proposes "
              "again only when usage moves."]
    return "\n".join(lines) + "\n"
