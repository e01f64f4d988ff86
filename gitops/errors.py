"""Typed errors of the git write-back.

Owns every failure `gitops` raises. Each class carries a PascalCase `reason`
(a stable code the controller puts in conditions and logs) and a message that
says what failed, why, and the fix. Messages are redacted before they get here:
no URL userinfo, no token. Raised by gitops.git, gitops.workcopy and
gitops.writeback; caught by the reconcile loop.
"""
from __future__ import annotations


class GitError(Exception):
    """Base class: `reason` names the failure, `fix` says what to do about it."""

    reason = "GitFailed"

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(f"{message}. Fix: {fix}")
        self.message = message
        self.fix = fix


class GitUnreachable(GitError):
    """The remote could not be reached (connection refused, DNS, timeout)."""

    reason = "GitUnreachable"


class GitAuthFailed(GitError):
    """The remote refused our credentials, or asked for some we do not have."""

    reason = "GitAuthFailed"


class RepoNotFound(GitError):
    """The remote answered but has no repository at that path."""

    reason = "RepoNotFound"


class BranchNotFound(GitError):
    """The tracked branch does not exist on the remote."""

    reason = "BranchNotFound"


class RevisionNotFound(GitError):
    """A commit asked about is not in the repository, even after a fetch."""

    reason = "RevisionNotFound"


class PushRejected(GitError):
    """The remote refused the push for a reason other than a newer upstream (hook, protection)."""

    reason = "PushRejected"


class PushRetriesExhausted(GitError):
    """Every attempt lost the race to a newer upstream."""

    reason = "PushRetriesExhausted"


class UnsafePath(GitError):
    """A generated path would leave the work tree or touch a file the controller does not own."""

    reason = "UnsafePath"


class InvalidWriteBack(GitError):
    """A `--write-back` target, owned prefix or remote URL that cannot be used as given."""

    reason = "InvalidWriteBack"


class WorkdirInUse(GitError):
    """The work directory exists, is not empty and is not our git checkout."""

    reason = "WorkdirInUse"


class GitCommandFailed(GitError):
    """git failed in a way none of the other classes describe."""

    reason = "GitCommandFailed"


class WorkdirBusy(GitError):
    """Another process uses the work directory: a second controller holds its lock, or a git process that is not
    this controller's runs in it."""

    reason = "WorkdirBusy"


class GitLocked(GitError):
    """git found a lock file in the work directory (`index.lock`, a ref's `.lock`): another git process holds
    it, or one that was killed left it."""

    reason = "GitLocked"


class WorkdirDamaged(GitError):
    """The work directory's repository cannot be read (a corrupt index, a missing or corrupt object, not a
    repository any more): the controller re-clones it."""

    reason = "WorkdirDamaged"


class PartialCloneRefused(GitError):
    """The remote serves filtered fetches but will not send an object asked for by its id (a server of git's
    protocol v0 without uploadpack.allowAnySHA1InWant), which a partial clone needs: the controller clones the whole
    repository instead."""

    reason = "PartialCloneRefused"
