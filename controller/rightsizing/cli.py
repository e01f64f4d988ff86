"""`gpushare rightsize` and `gpushare usage export`: the right-sizing loop from the command line.

`--repo` is the GitOps repository, a URL or a local path, as on every command (`--git` is its
old spelling); every duration flag takes contract.durations' one syntax.
- `gpushare rightsize --repo URL_OR_PATH --usage FILE` replays a usage file (controller.rightsizing.usage)
  against the repo's models and prints every decision the loop would have taken, with timestamps.
- `gpushare rightsize --repo URL_OR_PATH --prometheus URL` runs one right-sizing pass: reads usage over
  `--window` from Prometheus, commits Recommend proposals to review branches and the records to
  the tracked branch, or with `--review` to their review branch (controller.rightsizing.apply).
- `gpushare usage export --prometheus URL --since 1h` writes the usage format from Prometheus.
Owns arguments and printing only. Exit codes: 0 ok, 1 usage or repo unusable (a pass that could not
read usage still commits its records, each saying UsageMissing, and exits 1), 2 bad arguments.
"""
from __future__ import annotations

import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from controller.inputs.layout import Layout
from controller.inputs.reader import ClusterNotFound, read_repo
from controller.planning.capacity import kept_pool_slots
from gitops import GitError, WorkingCopy
from contract.durations import duration_flag as duration
from contract.quantity import format_bytes

from controller.inputs.rightsizing_records import RECORDS_BRANCH
from controller.policy import DEFAULT_WINDOW_S
from .prometheus import DETAIL_S, UsageUnavailable, read_usage
from .bounds import limits_for
from .recommender import Change, Slo, replay
from .step import profile_of
from .usage import UsageFormatError, by_model, dump_lines, escape, format_time, read_usage_file
from .window import WindowError, slot_for

DEFAULT_STEP_S = 15  # the scrape interval: a one-off pass and an export read Prometheus on it


def add_commands(sub) -> None:
    rs = sub.add_parser("rightsize", help="replay usage and print the loop's decisions, or run one right-sizing pass")
    rs.add_argument("--repo", "--git", dest="repo", help="the GitOps repository: a URL or a local path, as on every "
                                                          "command (replay reads it, a pass commits to it)")
    rs.add_argument("--usage", type=Path, help="replay: a usage file, one JSON sample per line ('-': stdin)")
    rs.add_argument("--all", action="store_true", help="replay models whose policy is Off too")
    rs.add_argument("--branch", default="main", help="the tracked branch of a repository URL (default: main)")
    rs.add_argument("--workdir", type=Path, help="pass: the checkout to use (default: a temporary directory)")
    rs.add_argument("--prometheus", help="pass: Prometheus' base URL, e.g. http://prometheus:9090")
    rs.add_argument("--window", type=duration, default=DEFAULT_WINDOW_S,
                    help="the usage window each pass decides on; replay forgets what is older (default: 2d, the "
                         "installed loop's --rightsize-window; whole half hours, at most 14d)")
    rs.add_argument("--step", type=duration, default=None,
                    help="the sample grid: a pass reads Prometheus on it (default: 15s, the scrape interval); a "
                         "replay judges gaps on it (default: each model's smallest spacing in the file)")
    rs.add_argument("--review", action="store_true",
                    help=f"pass: commit the records to the review branch {RECORDS_BRANCH} instead of --branch (as "
                         "the installed loop does under a review write-back); Auto applies once it is merged")
    rs.add_argument("--cluster", metavar="NAME",
                    help="in a repository with clusters/: the cluster whose models, usage and records these are")
    rs.set_defaults(run=_rightsize)

    usage = sub.add_parser("usage", help="usage samples for the right-sizing loop")
    usage_sub = usage.add_subparsers(required=True, metavar="ACTION")
    export = usage_sub.add_parser("export", help="write usage samples (JSON lines) from Prometheus' query_range API")
    export.add_argument("--prometheus", required=True, help="Prometheus' base URL")
    export.add_argument("--since", type=duration, default=86400, help="how far back (default: 1d)")
    export.add_argument("--step", type=duration, default=None, help="sample grid (default: 15s)")
    export.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    export.set_defaults(run=_export)


def _fail(message: str, code: int = 1) -> int:
    print(f"gpushare: {message}", file=sys.stderr)
    return code


def _rightsize(args) -> int:
    if not args.repo or bool(args.usage) == bool(args.prometheus):
        return _fail("rightsize takes --repo URL_OR_PATH and either --usage FILE (replay) or --prometheus URL "
                     "(one pass)", 2)
    try:
        slot_for(args.window, (args.step or DEFAULT_STEP_S) if args.prometheus else None)
    except WindowError as exc:
        return _fail(f"--window: {exc}", 2)
    if args.prometheus:
        return _pass(args)
    try:
        samples = by_model(read_usage_file(args.usage))
    except (OSError, UsageFormatError) as exc:
        return _fail(f"cannot read usage: {escape(str(exc))}")
    try:
        with local_tree(args.repo, args.branch) as root:
            if not (root / "models").is_dir():
                return _fail(f"{escape(args.repo)} has no models/ directory; pass the root of a GitOps repo", 2)
            tree = read_repo(root, cluster=args.cluster)
            return _replay(args, tree.inputs, samples, tuple(r.decision for r in tree.last.records.values()))
    except GitError as exc:
        return _fail(f"git: {exc}")
    except ClusterNotFound as exc:
        return _fail(f"[{exc.reason}] {exc.message}; fix: {exc.fix}", 2)


@contextmanager
def local_tree(repo: str, branch: str):
    """The tree of `repo` to read: a local directory as it is, else a checkout of `branch` of the URL (or of a
    path that is no directory) in a temporary directory removed afterwards."""
    if Path(repo).is_dir() and not _is_url(repo):
        yield Path(repo)
        return
    with tempfile.TemporaryDirectory(prefix="gpushare-repo-") as scratch:
        copy = WorkingCopy(repo, branch, Path(scratch) / "repo")
        copy.sync()
        yield copy.root


def _is_url(repo: str) -> bool:
    return "://" in repo or (":" in repo and "@" in repo.split(":", 1)[0])


def _replay(args, inputs, samples, decisions) -> int:
    """The installed loop's rule on each model's series: its bounds (the planner's view: GPU, elastic minimum,
    whether memory helps latency) and its window (the percentiles forget what is older than --window)."""
    models = inputs.models  # Auto models carry their effective budget (controller.inputs.reader)
    profiles = {p.key: p for p in inputs.profiles}
    by_key = {d.key: d for d in decisions}
    slots = (*inputs.slots, *kept_pool_slots(decisions, inputs.pools))  # as the loop sees them (rightsizing.apply)
    shown = 0
    for model in sorted(models, key=lambda m: m.key):
        if not (model.rightsizing.enabled or args.all):
            continue
        series = samples.get(model.ref)
        if not series:
            print(f"{model.ref}: no usage samples in {escape(str(args.usage))}")
            continue
        shown += 1
        decision = by_key.get(model.key)
        limits = limits_for(model, model.rightsizing, decision, slots, profile_of(model, decision, profiles))
        events, loop = replay(series, model.ref, model.budget_bytes, model.rightsizing,
                              Slo(model.slo.ttft_ms, model.slo.tpot_ms), limits=limits, window_s=args.window,
                              step_s=args.step)
        print(f"{model.ref}: policy {model.rightsizing.policy}, budget {format_bytes(model.budget_bytes)}, "
              f"{loop.samples} samples {format_time(series[0].time)} .. {format_time(series[-1].time)}")
        for e in events:
            print("  " + _event_line(e))
        print(f"  → budget {format_bytes(loop.budget)}" + (" (unchanged)" if loop.budget == model.budget_bytes else ""))
    unknown = sorted(set(samples) - {m.ref for m in models})
    if unknown:
        print(f"usage for models not in the repo (ignored): {escape(', '.join(unknown[:20]))}")
    if not shown:
        print("no model with a rightsizing policy has usage (add spec.rightsizing, or pass --all)")
    return 0


def _event_line(e) -> str:
    if isinstance(e, Change):
        ev = e.evidence
        breaches = f", breaches {'+'.join(ev.breaches)}" if ev.breaches else ""
        return (f"{format_time(e.at)}  {e.direction:<4}  {format_bytes(e.from_bytes)} → {format_bytes(e.to_bytes)}  "
                f"{e.reason}  (p{ev.percentile * 100:g} {format_bytes(ev.percentile_bytes)}, peak "
                f"{format_bytes(ev.peak_bytes)}, {ev.samples} samples{breaches})")
    return f"{format_time(e.at)}  hold  {e.reason}: {e.message}"


def _pass(args) -> int:
    from .apply import rightsize_once

    with tempfile.TemporaryDirectory(prefix="gpushare-rightsize-") as scratch:  # removed on every exit
        try:
            copy = WorkingCopy(args.repo, args.branch, args.workdir or Path(scratch) / "repo")
            step = args.step or DEFAULT_STEP_S
            result = rightsize_once(copy, lambda start, end, fleet: read_usage(args.prometheus, start, end, step,
                                                                               fleet=fleet, detail_s=DETAIL_S),
                                    time.time(), args.window, cluster=args.cluster,
                                    records_target=(f"branch:{Layout(args.cluster).branch(RECORDS_BRANCH)}"
                                                    if args.review else "direct"))
        except GitError as exc:
            return _fail(f"git: {exc}")
        except ClusterNotFound as exc:
            return _fail(f"[{exc.reason}] {exc.message}; fix: {exc.fix}", 2)
    print_pass(result)
    return 1 if result.usage_error else 0


def print_pass(result) -> None:
    """What a right-sizing pass (controller.rightsizing.apply.PassResult) committed, branch by branch."""
    for published in result.proposals:
        print(f"{published.branch}: {published.commit or 'no change'}")
    print(f"{result.records.branch}: {result.records.commit or 'no change'} ({result.records.message.splitlines()[0]})")
    if result.usage_error:
        print(f"usage unavailable, no budget changed: {result.usage_error}", file=sys.stderr)


def _export(args) -> int:
    end = time.time()
    try:
        samples = read_usage(args.prometheus, end - args.since, end, args.step or DEFAULT_STEP_S)
    except UsageUnavailable as exc:
        return _fail(str(exc))
    out = args.output.open("w", encoding="utf-8") if args.output else sys.stdout
    try:
        out.writelines(dump_lines(samples))
    finally:
        if args.output:
            out.close()
    if args.output:
        print(f"wrote {len(samples)} samples to {args.output}", file=sys.stderr)
    return 0
