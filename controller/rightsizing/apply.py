"""The right-sizing pass against a GitOps repository: read usage, run the step, commit.

Thin shell around controller.rightsizing.step. It checks out the tracked branch, loads
the models, the last decisions and the records, reads usage through the `read_usage`
function passed in (Prometheus, or a file), then:
- each Recommend proposal is published to its own review branch as the edit of the
  user's model file (its only owned path), with the evidence as the commit message;
- the records (decisions/rightsizing/, the only path owned there) go to the tracked
  branch, Auto's effective budgets and every condition with them; when the controller writes
  back for review (`--write-back branch:` or `pr:`), to their own review branch RECORDS_BRANCH
  instead, so nothing reaches the tracked branch unreviewed.
Usage that cannot be read changes no budget: the records say UsageMissing. `guard` runs right
before each commit is pushed (a cluster leader renews its Lease there and raises if it lost
it). Called by `gpushare rightsize --git`, the reconcile loops (controller.cli.rightsizing_loop)
and tests.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from controller.inputs.reader import read_repo
from contract.quantity import format_bytes
from gitops import Change, PublishResult, Target, WorkingCopy, parse_target, publish

from .edit import set_memory_budget
from .prometheus import UsageUnavailable
from controller.inputs.rightsizing_records import RECORDS_BRANCH, RECORDS_DIR, Record, records_from
from .step import Proposal, StepResult, step
from .usage import Sample, by_model

log = logging.getLogger("gpushare.rightsizing")
ReadUsage = Callable[[float, float], list[Sample]]


@dataclass(frozen=True)
class PassResult:
    step: StepResult
    proposals: tuple[PublishResult, ...]
    records: PublishResult
    usage_error: str | None


def rightsize_once(copy: WorkingCopy, read_usage: ReadUsage, now: float, window_s: float, *,
                   guard: Callable[[], None] = lambda: None, records_target: str | Target = "direct") -> PassResult:
    """One pass; `records_target`: where the records go (the tracked branch, or RECORDS_BRANCH when the
    controller writes back for review: then Auto's budgets apply once that branch is merged)."""
    review = parse_target(records_target).review
    heads = copy.sync(*((review,) if review else ()))
    root = copy.root
    tree = read_repo(root)  # models, records, prices and inventory, through the one reader and its limits
    inputs = tree.inputs
    usage_error = None
    try:
        usage = by_model(read_usage(now - window_s, now))
    except UsageUnavailable as exc:
        usage, usage_error = None, str(exc)
        log.warning("no usage this pass, no budget changes: %s", exc)
    records = dict(tree.rightsizing)
    if review and heads.get(review):  # the records awaiting review are the loop's history, not the merged ones
        records = {**records, **_records_at(copy, heads[review])}
    result = step(inputs.models, tuple(tree.last.previous.values()), inputs.slots,
                  records, usage, now, tree.prices, inputs.profiles)
    published = tuple(_propose(copy, p, guard) for p in result.proposals)
    copy.checkout(heads[copy.branch])

    def records_change(_root: Path) -> Change:
        guard()
        return Change(files={r.path: r.dump().encode() for r in result.records.values()},
                      message=_records_message(result, usage_error))

    records = publish(copy, records_change, owned=(RECORDS_DIR + "/",), target=records_target)
    return PassResult(result, published, records, usage_error)


def _records_at(copy: WorkingCopy, commit: str) -> dict[tuple[str, str], Record]:
    """The records `commit` holds (regular files under RECORDS_DIR), read from git without a checkout."""
    texts = {path: copy.git.run("cat-file", "blob", object_id).stdout.decode("utf-8", errors="replace")
             for path, (mode, object_id) in copy.entries(commit, (RECORDS_DIR + "/",)).items()
             if path.startswith(RECORDS_DIR + "/") and mode in ("100644", "100755")}
    return records_from(texts)


def _propose(copy: WorkingCopy, proposal: Proposal, guard: Callable[[], None]) -> PublishResult:
    source = proposal.model.source
    path, document = source.file, source.document

    def render(root: Path) -> Change:
        guard()
        text = (root / path).read_bytes().decode("utf-8")
        return Change(files={path: set_memory_budget(text, document, proposal.budget_bytes).encode()},
                      message=proposal.message)

    return publish(copy, render, owned=(path,), target=Target(proposal.branch))


def _records_message(result: StepResult, usage_error: str | None) -> str:
    lines = []
    for record in sorted(result.records.values(), key=lambda r: r.key):
        ref = f"{record.namespace}/{record.name}"
        held = [c for c in record.conditions if c.status == "False" or c.type in ("NeedsCapacity", "AtMaxBudget")]
        if record.open:
            verb = "applies" if record.policy == "Auto" else "proposes"
            lines.append(f"{ref}: {record.policy} {verb} {format_bytes(record.spec_budget_bytes)} → "
                         f"{format_bytes(record.budget_bytes)} ({record.reason})")
        lines += [f"{ref}: {c.reason}: {c.message}" for c in held]
    if usage_error:
        subject = f"gpushare right-sizing: usage unavailable, no budget changed ({len(result.records)} models hold)"
        body = [f"usage unavailable: {usage_error}"] + lines
    else:
        subject = (f"gpushare right-sizing: {lines[0]}" if len(lines) == 1 else
                   f"gpushare right-sizing: {len(lines)} updates" if lines else "gpushare right-sizing: records")
        body = lines if len(lines) > 1 else []
    return subject + ("\n\n" + "\n".join(body) if body else "") + "\n"
