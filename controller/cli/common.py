"""What the reconcile shells share: git credentials from flags, the checkout's place, how a pass is shown.

Owns the small pieces that `gpushare reconcile --offline` (controller.cli.reconcile_cmd)
and `--kube` (controller.cli.cluster_loop) both use, so neither imports the other.
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

from controller.cli import report
from controller.cli.offline import OfflineResult
from gitops import Credentials, GitError


def credentials_from(args) -> Credentials | None:
    if not (args.git_token_file or args.git_ssh_key_file):
        return None
    return Credentials(token_file=args.git_token_file, username=args.git_username,
                       ssh_key_file=args.git_ssh_key_file, known_hosts_file=args.git_known_hosts_file)


def default_workdir(repo: str, branch: str) -> Path:
    digest = hashlib.sha256(f"{repo}#{branch}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "gpushare" / f"checkout-{digest}"


def show(result: OfflineResult, out=None, *, table: bool = True) -> None:
    out = out or sys.stdout
    published, output = result.published, result.output
    if output is not None and table:
        out.write(report.as_table(output.plan, output.inputs.slots, output.inputs.errors, output.revived))
        for error in output.rendered.errors:
            out.write(f"not rendered: {error.ref}: [{error.reason}] {error.message} Fix: {error.fix}\n")
    if output is not None and output.held:
        out.write(f"read from the last good copy (the file is broken): {', '.join(output.held)}\n")
    if result.hold is not None:
        out.write(f"\nheld: {result.hold.message}\n  fix: {result.hold.fix}\n")
    if published.changed:
        subject = published.message.splitlines()[0]
        out.write(f"\ncommitted {published.commit[:12]} to {published.branch}: {subject}\n")
    else:
        head = published.heads.get(published.branch) or published.upstream  # the branch written, not the tracked one
        out.write(f"\nno change ({published.branch} at {head[:12]})\n")
    out.flush()


def fail(exc: GitError) -> int:
    print(f"gpushare: [{exc.reason}] {exc.message}\n  fix: {exc.fix}", file=sys.stderr)
    return 1
