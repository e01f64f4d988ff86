"""gitops: the controller's git working copy and write-back (fetch, render on top,
commit only when changed, push with bounded re-render retries, never forced).

The reconcile loop calls `WorkingCopy` and `publish`; everything raises typed
errors from `gitops.errors`.
"""
from gitops.credentials import Credentials
from gitops.errors import GitError
from gitops.git import Identity
from gitops.workcopy import WorkingCopy
from gitops.change import Change
from gitops.writeback import NO_CHANGE, Checkout, PublishResult, Target, parse_target, publish

__all__ = ["Change", "Checkout", "Credentials", "GitError", "Identity", "NO_CHANGE",
           "PublishResult", "Target", "WorkingCopy", "parse_target", "publish"]
