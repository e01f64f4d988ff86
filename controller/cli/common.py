"""What the reconcile shells share: git credentials from flags, the checkout's place, how a pass is shown.

Owns the small pieces that `gpushare reconcile --offline` (controller.cli.reconcile_cmd)
and `--kube` (controller.cli.cluster_loop) both use, so neither imports the other: credentials,
the checkout's place and what it holds (`controller_copy`), the pass's printout and outcome line,
the install's composition parameters (--worker-image) and the pull request step (--write-back pr:NAME).
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from controller.cli import report
from controller.cli.offline import OfflineResult
from controller.cli.review import open_proposal, open_review
from controller.inputs.cache_policy import host_path_root
from controller.inputs.compositions import shipped_compositions
from controller.inputs.layout import SINGLE, Layout
from controller.rendering.site import install_parameters, with_install_parameters
from gitops import Credentials, PublishResult, Target, WorkingCopy
from gitops.forge import PullRequest, forge_for
from gitops.workcopy import check_branch_name

log = logging.getLogger("gpushare.review")


def credentials_from(args) -> Credentials | None:
    from_directory(args)
    if not (args.git_token_file or args.git_ssh_key_file):
        return None
    return Credentials(token_file=args.git_token_file, username=args.git_username,
                       ssh_key_file=args.git_ssh_key_file, known_hosts_file=args.git_known_hosts_file)


def from_directory(args) -> None:
    """--git-credentials-dir DIR (the install's mounted Secret gpushare-git): `token` there is HTTPS (and the
    forge's token), else `ssh-privatekey` with `known_hosts` is SSH; explicit file flags win. So switching
    between HTTPS and SSH is a change of the Secret, never of the Deployment's arguments."""
    directory = getattr(args, "git_credentials_dir", None)
    if directory is None or args.git_token_file or args.git_ssh_key_file:
        return
    if (directory / "token").is_file():
        args.git_token_file = directory / "token"
    elif (directory / "ssh-privatekey").is_file():
        args.git_ssh_key_file = directory / "ssh-privatekey"
        known = directory / "known_hosts"
        args.git_known_hosts_file = args.git_known_hosts_file or (known if known.is_file() else None)


FORGE_SETTINGS = {"forge": "GPUSHARE_FORGE", "forge_api_url": "GPUSHARE_FORGE_API_URL"}


def forge_from_settings(args, environ=os.environ) -> None:
    """The install's forge settings (FORGE, FORGE_API_URL in deploy/default/settings.env, which the Deployment
    passes as GPUSHARE_FORGE and GPUSHARE_FORGE_API_URL) where --forge and --forge-api-url are not given; empty
    is unset. An unknown forge is refused by gitops.forge (ForgeUnknown) when a pull request is due."""
    for attribute, variable in FORGE_SETTINGS.items():
        if getattr(args, attribute, None) is None:
            setattr(args, attribute, environ.get(variable, "").strip() or None)


def default_workdir(repo: str, branch: str, cluster: str | None = None) -> Path:
    """A cache directory per repository and branch (and cluster: one machine may run the passes of several)."""
    digest = hashlib.sha256(f"{repo}#{branch}".encode() + (f"#{cluster}".encode() if cluster else b"")).hexdigest()
    return Path(tempfile.gettempdir()) / "gpushare" / f"checkout-{digest[:16]}"


def controller_copy(repo: str, branch: str, workdir: Path, credentials: Credentials | None = None,
                    layout: Layout = SINGLE) -> WorkingCopy:
    """The controller's working copy of `repo`: only the folders a pass of `layout`'s cluster reads are checked out
    (Layout.cone), the rest is listed and read from git; an existing full checkout is made sparse at its next
    pass. A cluster's new work directory in a repository of several is a partial clone (gitops.WorkingCopy): it
    downloads no other cluster's manifests."""
    return WorkingCopy(repo, branch, workdir, credentials=credentials, cone=layout.cone,
                       partial=layout.cluster is not None)


def show(result: OfflineResult, out=None, *, table: bool = True) -> None:
    out = out or sys.stdout
    published, output = result.published, result.output
    if output is not None and table:
        out.write(report.as_table(output.shown_plan, output.slots, output.inputs.errors, output.revived))
        for error in output.rendered.errors:
            out.write(f"not rendered: {error.ref}: [{error.reason}] {error.message} Fix: {error.fix}\n")
    if output is not None and output.held:
        out.write(f"read from the last good copy (the file is broken): {', '.join(output.held)}\n")
    if result.hold is not None:
        out.write(f"\nheld: {result.hold.message}\n  fix: {result.hold.fix}\n")
    out.write(f"\n{outcome_line(published)}\n")
    out.flush()


def outcome_line(published: PublishResult) -> str:
    """What a pass did to git, naming the branch written and the commit it is at."""
    if published.changed:
        return f"committed {published.commit[:12]} to {published.branch}: {published.message.splitlines()[0]}"
    tracked = next((name for name in published.heads if name != published.branch), published.branch)
    head = published.heads.get(published.branch)
    if published.branch == tracked:
        return f"no change ({tracked} at {published.upstream[:12]})"
    if head is None:
        return (f"no change (review branch {published.branch} does not exist yet: nothing differs from "
                f"{tracked} at {published.upstream[:12]})")
    return f"no change ({published.branch} at {head[:12]}; {tracked} at {published.upstream[:12]})"


def install_values(args) -> dict[str, object]:
    """The install's composition parameters (--worker-image), checked against the composition schema
    (InstallParameterInvalid); every pass applies them to the compositions it reads."""
    values = install_parameters(worker_image=args.worker_image, host_path_root=host_path_root())
    with_install_parameters(shipped_compositions(), values)  # refuse a bad value before any pass
    return values


def cluster_target(target: Target, layout: Layout) -> Target:
    """The write-back target of `layout`'s cluster: its review branch is its own (Layout.branch), so the reviews
    of two clusters never write one branch."""
    if target.review is None or layout.cluster is None:
        return target
    return Target(check_branch_name(layout.branch(target.review)), target.pull_request)


def reviewers(args, copy: WorkingCopy, target: Target | None = None, layout: Layout = SINGLE
              ) -> tuple[Callable[[PublishResult], None], Callable[[bool, PublishResult], None] | None]:
    """With --write-back pr:NAME, the pull requests: (after a reconcile pass: the review branch's, opened or
    updated; after a right-sizing pass: each Recommend branch's, opened for a new proposal, updated for a
    carried one while it is open, or None without pr:). Each branch head once per process (a pass that
    pushed nothing calls the forge only once), each request said (logged when polling). `target`: the
    write-back of this copy's cluster (default --write-back), whose PLAN.md `layout` names."""
    target = target or args.write_back
    if not target.pull_request:
        return (lambda published: None), None
    forge = forge_for(args.repo, args.forge, args.forge_api_url, args.git_token_file)
    reviewed: set[str | None] = set()

    def once(branch: str, published: PublishResult, open_pull: Callable[[], PullRequest | None]) -> None:
        head = published.heads.get(branch)
        if head in reviewed:
            return
        pull = open_pull()
        reviewed.add(head)
        if pull is not None:
            line = (f"{'opened' if pull.created else 'updated'} {forge.kind} pull request #{pull.number} "
                    f"({branch} into {copy.branch}): {pull.url}")
            if getattr(args, "interval", None):
                log.info("%s", line)  # polling: a timestamped log line
            else:
                print(line)

    def review(published: PublishResult) -> None:
        once(target.review, published, lambda: open_review(forge, copy, published, target, layout.plan_md))

    def propose(new: bool, published: PublishResult) -> None:
        once(published.branch, published, lambda: open_proposal(forge, copy, published, new))

    return review, propose


