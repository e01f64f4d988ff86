"""The `gpushare` command line: validate, plan, explain, reconcile, demo, rightsize, usage.

Owns argument parsing and exit codes only; each subcommand calls the stage modules
(load -> plan -> report/explain, or the reconcile loop). Exit codes: 0 ok, 1 the
input has errors (validate) or a pass failed, 2 bad usage.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from controller.cli import report
from controller.cli.offline import pass_over
from controller.planning.explain import ModelNotFound, explain
from controller.inputs.reader import read_repo
from controller.planning.plan import plan


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpushare", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    validate = sub.add_parser("validate", help="check a GitOps repo's inputs; exit 1 on any error (a PR check)")
    validate.add_argument("path", type=Path)
    validate.set_defaults(run=_validate)

    plan_cmd = sub.add_parser("plan", help="show where and how each ElasticModel would run")
    plan_cmd.add_argument("path", type=Path)
    plan_cmd.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    plan_cmd.set_defaults(run=_plan)

    explain_cmd = sub.add_parser("explain", help="the arithmetic behind one model's mode, in plain words")
    explain_cmd.add_argument("name")
    explain_cmd.add_argument("--repo", type=Path, required=True)
    explain_cmd.add_argument("-n", "--namespace")
    explain_cmd.set_defaults(run=_explain)

    from controller.cli.reconcile_cmd import add_commands  # the shell around the pass, kept apart from the core

    add_commands(sub)
    from controller.rightsizing.cli import add_commands as add_rightsizing_commands

    add_rightsizing_commands(sub)
    return parser


def _require_dir(path: Path) -> None:
    if not path.is_dir():
        print(f"gpushare: {path} is not a directory; pass the root of a GitOps repo (with models/)", file=sys.stderr)
        raise SystemExit(2)
    if not (path / "models").is_dir():
        print(f"gpushare: {path} has no models/ directory, so it is not the root of a GitOps repo; pass the "
              "directory that holds models/ (and gpus.yaml, profiles/)", file=sys.stderr)
        raise SystemExit(1)


def _validate(args) -> int:
    """The whole pass a reconcile would run (inputs, plan, compose), without git: every error it would report."""
    _require_dir(args.path)
    output = pass_over(args.path, processes=1)
    inputs, refused = output.inputs, output.rendered.errors
    for line in report.error_lines(inputs.errors):
        print(line)
    for error in refused:
        print(f"{error.ref}: [{error.reason}] {error.message} Fix: {error.fix}")
    for file in output.held:
        print(f"{file}: a reconcile would read its last good copy until it is fixed")
    total = len(inputs.errors) + len(refused)
    models = len(inputs.models) - len(output.revived)
    print(f"{models} ElasticModel(s), {len(inputs.profiles)} profile(s), {len(inputs.slots)} GPU slot(s); "
          f"{total} error(s)")
    return 1 if total else 0


def _plan(args) -> int:
    _require_dir(args.path)
    snapshot = read_repo(args.path)
    inputs, revived = snapshot.planned()  # as a reconcile pass plans
    result = plan(inputs, snapshot.previous)
    render = {"table": lambda: report.as_table(result, inputs.slots, inputs.errors, revived),
              "json": lambda: report.as_json(result, inputs.errors),
              "yaml": lambda: report.as_yaml(result, inputs.errors)}[args.output]
    sys.stdout.write(render())
    return 0


def _explain(args) -> int:
    _require_dir(args.repo)
    snapshot = read_repo(args.repo)
    inputs, _ = snapshot.planned()  # exactly what `plan` and a reconcile pass plan
    try:
        sys.stdout.write(explain(inputs, plan(inputs, snapshot.previous), args.name, args.namespace))
    except ModelNotFound as exc:
        print(f"gpushare: [{exc.reason}] {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
