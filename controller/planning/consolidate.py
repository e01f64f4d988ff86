"""Giving GPUs back: a plan that serves the same models on fewer pool nodes, as a proposal to review.

Owns `consolidate` (Karpenter's consolidation, knowing that two LLMs can share a GPU): from the plan a
normal pass makes, it tries the pool nodes the plan keeps one at a time, the least disruptive first (fewest
models, then the dearest node, then by name), and gives a node back when the planner, with that node
drained and no node opened, places every model the plan placed, every model that met its SLO still meets
it, and the models that move stay within the disruption bound. Never: a fixed node emptied for cost, a pool's
minNodes given back (they stay paid for), a model moved that is held (inside its right-sizing upsize window,
or breaching its SLO: `held_models`). Consolidation is never part of a normal pass: `gpushare consolidate`
and the cluster's periodic proposal render its plan as a change for review (controller.passes.reconcile with
`plan_with`); once merged, its decisions are the ones the next pass keeps (the stability rule), so the pass
follows it and commits nothing. Pure and deterministic. Called by controller.cli.consolidate and
`gpushare plan -o json` (consolidatedCostPerMonth).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from controller.planning.plan import plan
from controller.types import Decision, ElasticModel, Inputs, Plan, Pool

DEFAULT_MAX_MOVES = 5   # models one proposal may move (--max-moves)
MAX_TRIES = 16          # pool nodes one proposal tries to give back (each try is one plan of the fleet)


@dataclass(frozen=True)
class Move:
    ref: str
    before: Decision
    after: Decision


@dataclass(frozen=True)
class Proposal:
    """The consolidated plan, what moves, what is given back; `kept` says why a node was not given back."""

    plan: Plan
    before: Plan  # the plan a normal pass makes, which it starts from
    moves: tuple[Move, ...] = ()
    freed_nodes: tuple[str, ...] = ()  # pool node names given back
    freed_gpus: int = 0
    kept: tuple[tuple[str, str], ...] = ()  # (pool node, why it stays)

    @property
    def changed(self) -> bool:
        return bool(self.freed_nodes)


def held_models(models: Mapping[tuple[str, str], ElasticModel], decisions: Mapping[tuple[str, str], Decision],
                now: float) -> dict[tuple[str, str], str]:
    """The models consolidation never moves, and why: one predicted to miss its SLO (moving it to a fuller GPU
    cannot help), and one inside its right-sizing upsize window (its budget grows soon: a recommendation or an
    applied upsize younger than its upsizeAfter, or the loop says it needs capacity)."""
    held = {}
    for key, decision in sorted(decisions.items()):
        model = models.get(key)
        if decision.slo_met is False:
            held[key] = "it is predicted to miss its SLO"
        elif model is not None and model.rightsizing.enabled:
            why = _upsizing(model, now)
            if why:
                held[key] = why
    return held


def _upsizing(model: ElasticModel, now: float) -> str | None:
    if any(c.get("type") == "NeedsCapacity" and c.get("status") == "True" for c in model.rightsizing_conditions):
        return "right-sizing says it needs capacity"
    recommendation = model.rightsizing_recommendation or {}
    if recommendation.get("direction") != "up":
        return None
    at = _seconds(recommendation.get("at"))
    if at is None or now - at < model.rightsizing.upsize_after_s:
        return f"it is inside its right-sizing upsize window (upsizeAfter {model.rightsizing.upsize_after_s} s)"
    return None


def _seconds(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def consolidate(inputs: Inputs, current: Plan, *, max_moves: int = DEFAULT_MAX_MOVES,
                held: Mapping[tuple[str, str], str] | None = None, method: str = "auto") -> Proposal:
    """The proposal from `current` (the plan a normal pass makes of `inputs`): the pool nodes given back, at most
    `max_moves` models moved, none of `held`."""
    held = held or {}
    pools = {p.name: p for p in inputs.pools}
    accepted = {d.key: d for d in current.decisions}
    best, drained, moved, kept = current, set(), set(), []
    for node in _candidates(best.decisions, pools)[:MAX_TRIES]:
        here = [d for d in best.decisions if d.slot and d.slot.split("/")[0] == node and d.mode != "refused"]
        stays = [d for d in here if d.key in held]
        if stays:
            kept.append((node, f"{stays[0].namespace}/{stays[0].name} is held: {held[stays[0].key]}"))
            continue
        if len(moved | {d.key for d in here}) > max_moves:
            kept.append((node, f"moving its {len(here)} model(s) would exceed the bound of {max_moves} per proposal"))
            continue
        previous = {k: d for k, d in accepted.items() if all(k != h.key for h in here)}
        trial = plan(inputs, previous, method=method, drain=frozenset(drained | {node}))
        why = _refused_trial(current, trial, held, max_moves)
        if why:
            kept.append((node, why))
            continue
        best, drained = trial, drained | {node}
        accepted = {d.key: d for d in trial.decisions}
        moved = {d.key for d in _moves(current, trial)}
    moves = tuple(Move(f"{a.namespace}/{a.name}", b, a) for b, a in _pairs(current, best))
    freed = sorted(drained)
    gpus = sum(pools[_pool_of(n, pools)].gpus_per_node for n in freed)
    return Proposal(best, current, moves, tuple(freed), gpus, tuple(kept))


def _candidates(decisions, pools: Mapping[str, Pool]) -> list[str]:
    """The pool nodes a plan keeps beyond their pools' minNodes, the least disruptive first: fewest models, then
    the dearest node (most GPUs), then by name."""
    models: dict[str, int] = defaultdict(int)
    for d in decisions:
        if d.pool in pools and d.mode != "refused" and d.slot:
            node = d.slot.split("/")[0]
            k = pools[d.pool].ordinal(node)
            if k is not None and k >= pools[d.pool].min_nodes:
                models[node] += 1
    return sorted(models, key=lambda n: (models[n], -pools[_pool_of(n, pools)].gpus_per_node, n))


def _pool_of(node: str, pools: Mapping[str, Pool]) -> str:
    return next(name for name, p in pools.items() if p.ordinal(node) is not None)


def _placement(d: Decision) -> tuple:
    return (d.mode, d.slot, d.resident_layers)


def _pairs(before: Plan, after: Plan) -> list[tuple[Decision, Decision]]:
    old = {d.key: d for d in before.decisions}
    return [(old[d.key], d) for d in after.decisions if d.key in old and _placement(old[d.key]) != _placement(d)]


def _moves(before: Plan, after: Plan) -> list[Decision]:
    return [a for _, a in _pairs(before, after)]


MODE_RANK = {"resident": 0, "swap": 1, "elastic": 2, "refused": 3}


def _worse(before: Decision, after: Decision) -> bool:
    """Giving a GPU back never makes a model swap or stream that did not, nor stream more of its layers."""
    return MODE_RANK[after.mode] > MODE_RANK[before.mode] or (
        before.mode == after.mode == "elastic" and after.resident_layers < before.resident_layers)


def _refused_trial(current: Plan, trial: Plan, held: Mapping[tuple[str, str], str], max_moves: int) -> str | None:
    """Why a trial plan is no proposal, or None when it is one."""
    now = {d.key: d for d in trial.decisions}
    for d in current.decisions:
        after = now.get(d.key)
        if d.mode != "refused" and (after is None or after.mode == "refused"):
            return f"{d.namespace}/{d.name} would have no place"
        if d.slo_met is not False and after is not None and after.slo_met is False:
            return f"{d.namespace}/{d.name} would miss its SLO"
        if after is not None and _worse(d, after):
            return (f"{d.namespace}/{d.name} would run {after.mode} with {after.resident_layers}/{after.total_layers} "
                    f"layers on the GPU where it runs {d.mode} with {d.resident_layers}")
    moved = _moves(current, trial)
    if any(d.key in held for d in moved):
        return "a held model would move"
    if len(moved) > max_moves:
        return f"{len(moved)} models would move, more than the bound of {max_moves} per proposal"
    return None
