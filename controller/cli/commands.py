"""The `gpushare` command line: validate, plan, explain, reconcile, demo, rightsize, usage, consolidate.

Owns argument parsing and exit codes only; each subcommand calls the stage modules
(load -> plan -> report/explain, or the reconcile loop). Exit codes, as terraform's: 0 ok, 1 the
input has errors or a pass failed, 2 bad usage; `plan --detailed-exitcode`: 0 no change, 1 errors,
2 the plan changes decisions. A model is named NAME or NS/NAME everywhere; --repo defaults to `.`. A repository
with clusters/ is planned cluster by cluster (controller.cli.fleet): every cluster, or `--cluster NAME`.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

from controller.cli import logs, report
from controller.cli.report import fail
from controller.cli.fleet import chosen_clusters, cluster_name, distinct, passes, repository_errors
from controller.cli.validate import validate_paths
from controller.passes.reconcile import plan_bill
from controller.planning.bill import capacity_doc
from controller.planning.consolidate import consolidate, held_models
from controller.planning.explain import ModelNotFound, explain
from controller.inputs.reader import ClusterNotFound, read_repo
from controller.planning.plan import plan


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    polling = bool(getattr(args, "interval", None) or getattr(args, "kube", False))
    logs.configure(args.log_format, level=logging.INFO if polling else logging.WARNING)  # a one-shot run prints
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpushare", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="log lines (polling, cluster mode): timestamped text, or one JSON object per line")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    validate = sub.add_parser("validate", help="check GitOps inputs, a repo or single files; exit 1 on any error "
                                               "(a PR check or a pre-commit hook)")
    validate.add_argument("paths", type=Path, nargs="*", default=[Path(".")], metavar="FILE|DIR",
                          help="a GitOps repo (with models/), a directory of YAML files or a file (default: .)")
    add_cluster_argument(validate, "check")
    validate.set_defaults(run=_validate)

    plan_cmd = sub.add_parser("plan", help="show where and how each ElasticModel would run")
    plan_cmd.add_argument("path", type=Path, nargs="?", default=Path("."), help="the GitOps repo (default: .)")
    plan_cmd.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table")
    plan_cmd.add_argument("--detailed-exitcode", action="store_true",
                          help="exit 0 when no decision changes, 2 when some do, 1 on input errors (terraform's)")
    add_cluster_argument(plan_cmd, "plan")
    plan_cmd.set_defaults(run=_plan)

    explain_cmd = sub.add_parser("explain", help="the arithmetic behind one model's mode, in plain words")
    explain_cmd.add_argument("name", metavar="[NS/]NAME")
    explain_cmd.add_argument("--repo", default=".", help="the GitOps repository: a URL or a local path, as on every "
                                                          "command (default: .)")
    explain_cmd.add_argument("--branch", default="main", help="the tracked branch of a repository URL (default: main)")
    explain_cmd.add_argument("-n", "--namespace")
    add_cluster_argument(explain_cmd, "explain the model in")
    explain_cmd.set_defaults(run=_explain)

    from controller.cli.reconcile_cmd import add_commands  # the shell around the pass, kept apart from the core

    add_commands(sub)
    from controller.rightsizing.cli import add_commands as add_rightsizing_commands

    add_rightsizing_commands(sub)
    from controller.cli.consolidate import add_commands as add_consolidate_commands

    add_consolidate_commands(sub)
    return parser


def add_cluster_argument(parser, verb: str, default: str | None = None) -> None:
    parser.add_argument("--cluster", metavar="NAME", type=cluster_name, default=default,
                        help=f"in a repository with clusters/: {verb} this cluster only (default: every cluster)")


def model_ref(text: str, namespace: str | None) -> tuple[str | None, str]:
    """(namespace, name) of `NAME` or `NS/NAME` (kubectl's habit); -n must agree with an NS/ given."""
    given, _, name = text.rpartition("/")
    if not name or text.count("/") > 1:
        raise ValueError(f"{text!r} is neither NAME nor NS/NAME; write e.g. llm/chat-small")
    if given and namespace and given != namespace:
        raise ValueError(f"{text!r} names namespace {given!r} but -n says {namespace!r}; give one of them")
    return given or namespace, name


def _version() -> str:
    """The installed distribution's version (the images' tags follow it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpushare-elastic")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _require_dir(path: Path) -> None:
    if not path.is_dir():
        print(f"gpushare: {path} is not a directory; pass the root of a GitOps repo (with models/)", file=sys.stderr)
        raise SystemExit(2)
    if not (path / "models").is_dir():
        print(f"gpushare: {path} has no models/ directory, so it is not the root of a GitOps repo; pass the "
              "directory that holds models/ (and gpus.yaml, profiles/)", file=sys.stderr)
        raise SystemExit(1)


def _validate(args) -> int:
    """Each GitOps repo named (a directory with models/) gets the whole pass a reconcile would run (inputs, plan,
    compose) without git: every error it would report; other directories and files are checked by kind."""
    repos = [p for p in args.paths if p.is_dir() and (p / "models").is_dir()]
    inputs, compositions = validate_paths([p for p in args.paths if p not in repos])
    models, profiles, slots = len(inputs.models), len(inputs.profiles), len(inputs.slots)
    total = len(inputs.errors)
    for line in report.error_lines(inputs.errors):
        print(line)
    every = []  # every pass of every repository named
    for repo in repos:
        try:  # the pass `plan` and a reconcile run, per cluster: inputs, plan and render
            outputs = passes(repo, args.cluster)
        except ClusterNotFound as exc:
            return fail(exc, 2)
        every += outputs.values()
        errors = distinct([*(repository_errors(repo) if not outputs else ()),
                           *(e for output in outputs.values() for e in output.errors)])
        for line in report.error_lines(errors):
            print(line)
        for file in sorted({file for output in outputs.values() for file in output.held}):
            print(f"{file}: a reconcile would read its last good copy until it is fixed")
        total += len(errors)
        models += len({m.key for o in outputs.values() for m in o.inputs.models if m.ref not in o.revived})
        profiles += len({(p.key, p.file) for o in outputs.values() for p in o.inputs.profiles})
        slots += sum(len(output.inputs.slots) for output in outputs.values())
    pools = sum(len(o.inputs.pools) for o in every)
    pools = f", {pools} node pool(s)" if pools else ""  # shown where there are pools
    print(f"{models} ElasticModel(s), {profiles} profile(s), {slots} GPU slot(s){pools}, {compositions} "
          f"composition(s); {total} error(s)")
    return 1 if total else 0


def _plan(args) -> int:
    _require_dir(args.path)
    try:
        outputs = passes(args.path, args.cluster)  # the pass `validate` and a reconcile run, render included
    except ClusterNotFound as exc:
        return fail(exc, 2)
    if list(outputs) == [None]:
        output = outputs[None]
        inputs, result, errors, revived = output.inputs, output.shown_plan, output.errors, output.revived
        render = {"table": lambda: report.as_table(result, output.slots, errors, revived),
                  "wide": lambda: report.as_table(result, output.slots, errors, revived, profiles=inputs.profiles),
                  "json": lambda: report.as_json(result, errors, _capacity(output)),
                  "yaml": lambda: report.as_yaml(result, errors, _capacity(output))}[args.output]
    else:
        errors = distinct([*(repository_errors(args.path) if not outputs else ()),
                           *(e for output in outputs.values() for e in output.errors)])
        capacities = {name: _capacity(output) for name, output in outputs.items()} if args.output in (
            "json", "yaml") else {}
        render = {"table": lambda: report.clusters_table(outputs, errors),
                  "wide": lambda: report.clusters_table(outputs, errors, wide=True),
                  "json": lambda: report.clusters_json(outputs, errors, capacities),
                  "yaml": lambda: report.clusters_yaml(outputs, errors, capacities)}[args.output]
    sys.stdout.write(render())
    if errors:
        print(f"gpushare: {len(errors)} input error(s): the plan leaves those models out (or keeps their last good "
              "spec or objects); `gpushare validate` lists them with their fixes", file=sys.stderr)
        return 1
    return 2 if args.detailed_exitcode and any(o.rendered.changes for o in outputs.values()) else 0


def _capacity(output) -> dict:
    """`plan -o json`'s capacity: what the plan keeps and costs, and (with pools) what consolidation would."""
    now = plan_bill(output.inputs, output.plan.decisions)
    consolidated = None
    if output.inputs.pools:
        held = held_models({m.key: m for m in output.inputs.models}, {d.key: d for d in output.plan.decisions},
                           time.time())
        proposal = consolidate(output.inputs, output.plan, held=held)
        consolidated = plan_bill(output.inputs, proposal.plan.decisions) if proposal.changed else None
    return capacity_doc(now, consolidated)


def _explain(args) -> int:
    try:
        namespace, name = model_ref(args.name, args.namespace)
    except ValueError as exc:
        print(f"gpushare: [InvalidName] {exc}", file=sys.stderr)
        return 2
    from controller.rightsizing.cli import local_tree
    from gitops import GitError
    try:
        with local_tree(args.repo, args.branch) as root:  # a URL: its tracked branch, checked out for the call
            _require_dir(root)
            trees = {cluster: read_repo(root, cluster=cluster) for cluster in chosen_clusters(root, args.cluster)}
    except GitError as exc:
        print(f"gpushare: [{exc.reason}] {exc}", file=sys.stderr)
        return 1
    except ClusterNotFound as exc:
        return fail(exc, 2)
    explained, missing = [], None
    for cluster, tree in trees.items():
        inputs, _ = tree.planned()  # exactly what `plan` and a reconcile pass plan
        try:
            result = plan(inputs, tree.last.previous)  # explain sees the pool nodes' GPUs the plan keeps too
            text = explain(replace(inputs, slots=(*inputs.slots, *result.pool_slots)), result, name, namespace)
        except ModelNotFound as exc:
            missing = missing or exc
            continue
        explained.append(text if cluster is None else f"== cluster {cluster} ==\n{text}")
    if not trees:
        print("gpushare: [NoClusters] clusters/ holds no usable cluster folder; `gpushare validate` says why",
              file=sys.stderr)
        return 1
    if not explained:
        where = "" if list(trees) == [None] else f" in {'cluster ' + args.cluster if args.cluster else 'any cluster'}"
        print(f"gpushare: [{missing.reason}] {missing}{where}", file=sys.stderr)
        return 1
    sys.stdout.write("\n".join(explained))
    return 0


if __name__ == "__main__":
    sys.exit(main())
