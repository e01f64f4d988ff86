"""The pull request of a review branch: after a pass pushed `--write-back pr:BRANCH`, open or update it.

Owns what the request says: its title is the review branch head's commit subject (what changed and
why), its body PLAN.md's summary at that commit (controller.planmd.review_summary). Nothing is opened
when the review branch does not exist or holds the tracked branch's tree (nothing to review). Called
by the reconcile shells (offline and cluster) after gitops.publish; the HTTP is gitops.forge's.

`open_proposal` does the same for a right-sizing Recommend branch (`gpushare/rightsize-<ns>-<name>`):
title and body are its head commit's subject and evidence; a new proposal opens or updates its request,
one carried to a new base only updates an open one (a request the reviewer closed stays closed).
"""
from __future__ import annotations

from gitops import PublishResult, WorkingCopy
from gitops.forge import Forge, PullRequest
from gitops.writeback import Target

from controller.inputs.layout import PLAN_MD
from controller.rendering.planmd import review_summary


def open_proposal(forge: Forge, copy: WorkingCopy, published: PublishResult, new: bool) -> PullRequest | None:
    """A Recommend branch's pull request into the tracked branch; None when there is nothing to review, or
    when the proposal is carried (`new` False) and no request is open."""
    head = _to_review(copy, published, published.branch)
    if head is None:
        return None
    subject = copy.git.text("log", "-1", "--format=%s", head)
    body = copy.git.text("log", "-1", "--format=%b", head).strip()
    if new:
        return forge.ensure(published.branch, copy.branch, subject, body)
    return forge.update_open(published.branch, copy.branch, subject, body)


def open_review(forge: Forge, copy: WorkingCopy, published: PublishResult, target: Target,
                plan_path: str = PLAN_MD) -> PullRequest | None:
    """The review branch's one pull request, opened or updated; None when there is nothing to review. `plan_path`:
    the PLAN.md of the branch's cluster."""
    head = _to_review(copy, published, target.review or "")
    if head is None:
        return None
    subject = copy.git.text("log", "-1", "--format=%s", head)
    try:
        plan = copy.git.text("show", f"{head}:{plan_path}")
    except Exception:  # noqa: BLE001 - a tree without PLAN.md still gets a request, with the subject only
        plan = ""
    return forge.ensure(target.review, copy.branch, subject, review_summary(plan, head, copy.branch, plan_path))


def _to_review(copy: WorkingCopy, published: PublishResult, branch: str) -> str | None:
    """The head of `branch` after the push, or None when it is absent or holds the tracked branch's tree."""
    head = published.heads.get(branch)
    return None if head is None or copy.tree_of(head) == copy.tree_of(published.upstream) else head
