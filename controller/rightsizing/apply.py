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
Usage that cannot be read changes no budget: the records say UsageMissing; a model whose series
Prometheus sent could not be trusted holds alone, with the reader's reason (UsageImplausible,
UsageMalformed). `guard` runs right
before each commit is pushed (a cluster leader renews its Lease there and raises if it lost
it). With clusters/, each cluster's loop reads its own usage and models and writes its own records
(decisions/<cluster>/rightsizing/); a spec.memoryBudget is every cluster's that plans the model, so
a Recommend proposal never goes below what another of those clusters' records recommends: each
proposes the largest of them (`_largest`), and all converge on one edit of the user's file on the
model's one proposal branch. Called by `gpushare rightsize --git`, the reconcile loops
(controller.cli.rightsizing_loop) and tests.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from controller.inputs.layout import Layout
from controller.inputs.reader import read_repo
from controller.inputs.repofiles import RepoFileError, max_file_bytes, max_state_bytes
from controller.planning.capacity import kept_pool_slots
from contract.quantity import format_bytes
from gitops import Change, Checkout, PublishResult, Target, WorkingCopy, parse_target, publish

from .edit import BudgetEditError, set_memory_budget
from .prometheus import Usage, UsageUnavailable
from controller.inputs.rightsizing_records import Condition, Record, Records, records_from
from .step import HOLD_CONDITIONS, Proposal, StepResult, step
from .usage import Sample, by_model

log = logging.getLogger("gpushare.rightsizing")
ReadUsage = Callable[[float, float, Mapping[str, float]], list[Sample]]
"""(start, end, the fleet: namespace/name -> its upsizeAfter in seconds, how far back a breach is read on the grid)"""


@dataclass(frozen=True)
class PassResult:
    step: StepResult
    proposals: tuple[PublishResult, ...]
    records: PublishResult
    usage_error: str | None


def rightsize_once(copy: WorkingCopy, read_usage: ReadUsage, now: float, window_s: float, *,
                   guard: Callable[[], None] = lambda: None, records_target: str | Target = "direct",
                   cluster: str | None = None) -> PassResult:
    """One pass; `records_target`: where the records go (the tracked branch, or RECORDS_BRANCH when the
    controller writes back for review: then Auto's budgets apply once that branch is merged); `cluster`: with
    clusters/, the cluster whose models and records these are."""
    review = parse_target(records_target).review
    layout = Layout(cluster)
    heads = copy.sync(*((review,) if review else ()))
    root = copy.root
    # models, records, prices and inventory, through the one reader and its limits; the controller's paths, the
    # decision records and the clusters' inventories from git (the controller's sparse work tree leaves them out)
    owned = layout.cluster_generated
    checkout = Checkout.at(copy, heads[copy.branch], owned)
    tree = read_repo(root, generated=checkout.generated, committed=checkout, cluster=cluster)
    inputs = tree.inputs
    usage_error, held, grid = None, {}, {}
    try:
        read = read_usage(now - window_s, now, {m.ref: m.rightsizing.upsize_after_s for m in inputs.models
                                                 if m.rightsizing.enabled})
    except UsageUnavailable as exc:
        usage, usage_error = None, str(exc)
        log.warning("no usage this pass, no budget changes: %s", exc)
    else:
        usage = by_model(read)
        if isinstance(read, Usage):
            held, grid = read.held, {"step_s": read.step_s, "history_until": read.history_until,
                                     "acts_after": read.acts_after}
            if read.outside:
                log.info("usage: %d series of models outside the fleet were skipped", read.outside)
    problems = list(tree.rightsizing.problems)
    records = dict(tree.rightsizing)
    if review and heads.get(review):  # the records awaiting review are the loop's history, not the merged ones
        pending = _records_at(copy, heads[review], layout)
        records, problems = {**records, **pending}, [*problems, *pending.problems]
    bad = {p.key: f"{p.path}: {p.message}" for p in problems if p.key is not None and p.key not in records}
    previous = tuple(tree.last.previous.values())
    slots = (*inputs.slots, *kept_pool_slots(previous, inputs.pools))  # the pool nodes' GPUs the last plan keeps
    result = _homed(step(inputs.models, previous, slots, records, usage, now, tree.prices, inputs.profiles, held,
                         bad, window_s=window_s, **grid), layout)
    if cluster is not None:
        result = _largest(result, _other_records(copy, heads[copy.branch], cluster, tree.clusters), cluster)
    result = _editable(lambda path: _model_file(checkout, path), result)
    published = tuple(_propose(copy, p, guard) for p in result.proposals)
    copy.checkout(heads[copy.branch])

    def records_change(_checkout: Checkout) -> Change:
        guard()
        return Change(files={r.path: r.dump().encode() for r in result.records.values()},
                      message=_records_message(result, usage_error))

    records = publish(copy, records_change, owned=(layout.rightsizing + "/",), target=records_target)
    return PassResult(result, published, records, usage_error)


def _records_at(copy: WorkingCopy, commit: str, layout: Layout) -> Records:
    """The records `commit` holds (regular files under `layout`'s records folder), read from git without a
    checkout."""
    under = layout.rightsizing + "/"
    files = {path: object_id for path, (mode, object_id) in copy.entries(commit, (under,)).items()
             if path.startswith(under) and mode in ("100644", "100755")}
    copy.prefetch(files.values())  # a partial work directory: one fetch for the records it lacks
    blobs = {path: copy.git.run("cat-file", "blob", object_id).stdout for path, object_id in files.items()}
    limit = max_state_bytes()
    # each decoded by records_from: one that is not UTF-8 is that model's RecordProblem
    return records_from({path: blob if len(blob) <= limit else RepoFileError(
        "FileTooLarge", f"{path} has {len(blob)} bytes, more than the limit of {limit}", "delete it")
        for path, blob in blobs.items()}, directory=layout.rightsizing)


def _homed(result: StepResult, layout: Layout) -> StepResult:
    """The step's records filed under `layout`'s own records folder (decisions/<cluster>/rightsizing/)."""
    return StepResult({key: replace(record, directory=layout.rightsizing) for key, record in result.records.items()},
                      result.proposals)


def _other_records(copy: WorkingCopy, commit: str, cluster: str, clusters: tuple[str, ...]
                   ) -> dict[str, Records]:
    """Every other cluster's records as `commit` holds them (what those loops last committed), by cluster."""
    return {name: _records_at(copy, commit, Layout(name)) for name in clusters if name != cluster}


def _largest(result: StepResult, others: dict[str, Records], cluster: str) -> StepResult:
    """Each Recommend proposal at the largest budget the clusters that plan its model recommend: its own and each
    other cluster's record that starts from the same spec.memoryBudget (a record at that budget recommends keeping
    it), so a downsize lands only when every such cluster asks for less, and two clusters' controllers converge on
    one edit of the shared file. A proposal that comes back to the budget in force is dropped."""
    proposals = []
    for proposal in result.proposals:
        model = proposal.model
        theirs = {name: record for name, records in sorted(others.items())
                  if isinstance(record := records.get(model.key), Record) and record.policy == "Recommend"
                  and record.spec_budget_bytes == model.spec_budget_bytes}
        name, budget = max([(cluster, proposal.budget_bytes), *((n, r.budget_bytes) for n, r in theirs.items())],
                           key=lambda item: item[1])
        if budget == model.spec_budget_bytes:
            log.info("%s: no proposal: %s recommends keeping %s", model.ref, name, format_bytes(budget))
            continue
        if budget != proposal.budget_bytes:
            subject = (f"{model.ref}: memoryBudget {format_bytes(model.spec_budget_bytes)} → {format_bytes(budget)} "
                       f"(right-sizing: the largest its clusters recommend, {name}'s)")
            note = (f"{cluster} recommends {format_bytes(proposal.budget_bytes)}; {name}, which plans it too, "
                    f"recommends {format_bytes(budget)}: the budget is every cluster's, so the largest is proposed. "
                    f"{cluster}'s evidence:")
            proposal = replace(proposal, budget_bytes=budget, message=f"{subject}\n\n{note}\n{proposal.message}")
        proposals.append(proposal)
    return StepResult(result.records, tuple(proposals))


def _editable(read: Callable[[str], str], result: StepResult) -> StepResult:
    """The step's result without the proposals whose file cannot be edited safely: each such model's record says
    why (ProposalWritten False, the edit's reason and fix); the other proposals go on. `read(path)`: a model file's
    text (from git, as the pass read it: a cluster's controller checks out no models/)."""
    kept, records = [], dict(result.records)
    for proposal in result.proposals:
        model = proposal.model
        try:
            text = read(model.source.file)
            set_memory_budget(text, model.namespace, model.name, proposal.budget_bytes)
        except (OSError, UnicodeDecodeError, BudgetEditError) as exc:
            reason = getattr(exc, "reason", "UnparsableModelFile")
            message = str(exc) if isinstance(exc, BudgetEditError) else "the model's file cannot be read as UTF-8"
            log.warning("%s: no proposal written: %s: %s", model.ref, reason, message)
            record = records[model.key]
            records[model.key] = replace(record, conditions=(*record.conditions, Condition(
                "ProposalWritten", "False", reason, f"{message}; the recommendation stays in this record")))
            continue
        kept.append(proposal)
    return StepResult(records, tuple(kept))


def _propose(copy: WorkingCopy, proposal: Proposal, guard: Callable[[], None]) -> PublishResult:
    model = proposal.model
    path = model.source.file

    def render(checkout: Checkout) -> Change:
        guard()
        text = _model_file(checkout, path)
        return Change(files={path: set_memory_budget(text, model.namespace, model.name,
                                                     proposal.budget_bytes).encode()},
                      message=proposal.message)

    return publish(copy, render, owned=(path,), target=Target(proposal.branch))


def _model_file(checkout: Checkout, path: str) -> str:
    """The text of the model file `path` in the checked-out commit; OSError when git holds no readable file there,
    UnicodeDecodeError when it is no UTF-8."""
    data = checkout.read([path], max_file_bytes()).get(path)
    if data is None:
        raise FileNotFoundError(path)
    return data.decode("utf-8")


def _records_message(result: StepResult, usage_error: str | None) -> str:
    lines = []
    for record in sorted(result.records.values(), key=lambda r: r.key):
        ref = f"{record.namespace}/{record.name}"
        held = [c for c in record.conditions if c.status == "False" or c.type in ("NeedsCapacity", *HOLD_CONDITIONS)]
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
