"""A thin, typed wrapper of the git CLI.

Owns how gitops runs git: a clean environment (no user or system config, no
inherited GIT_* variables such as GIT_TRACE_CURL that could log a token, no
terminal prompts, C locale so messages parse), the commit identity, a timeout
that kills git's whole process group, and the mapping of git's failure text to
typed errors. Also parses `git push --porcelain`. Called by gitops.workcopy only.
"""
from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gitops.credentials import Credentials, redact
from gitops.errors import (BranchNotFound, GitAuthFailed, GitCommandFailed, GitError,
                           GitUnreachable, RepoNotFound)

log = logging.getLogger("gpushare.gitops")

_FIX_NETWORK = "check the repository URL and that the git server is up and reachable from here; the next pass retries"
_FIX_AUTH = "check that the token or SSH key Secret is mounted, current, and allowed to read and push this repository"
# (lower-case needle in stderr, error class, fix). First match wins: auth and
# not-found messages arrive together with the generic "Could not read from remote".
_FAILURES: tuple[tuple[str, type[GitError], str], ...] = (
    ("host key verification failed", GitAuthFailed,
     "add the server's host key to the known_hosts file passed with the SSH key"),
    ("authentication failed", GitAuthFailed, _FIX_AUTH),
    ("could not read username", GitAuthFailed, _FIX_AUTH),
    ("could not read password", GitAuthFailed, _FIX_AUTH),
    ("terminal prompts disabled", GitAuthFailed, _FIX_AUTH),
    ("permission denied (publickey", GitAuthFailed, _FIX_AUTH),
    ("permission to ", GitAuthFailed, _FIX_AUTH),
    ("returned error: 401", GitAuthFailed, _FIX_AUTH),
    ("returned error: 403", GitAuthFailed, _FIX_AUTH),
    ("couldn't find remote ref", BranchNotFound,
     "push an initial commit to that branch, or track a branch that exists"),
    ("repository not found", RepoNotFound, "check the repository URL"),
    ("does not appear to be a git repository", RepoNotFound, "check the repository URL or path"),
    ("repository not exported", RepoNotFound, "check the repository URL"),
    ("returned error: 404", RepoNotFound, "check the repository URL"),
    ("ssl certificate problem", GitUnreachable,
     "trust the server's certificate authority in the controller's CA bundle"),
    ("could not resolve host", GitUnreachable, _FIX_NETWORK),
    ("unable to connect", GitUnreachable, _FIX_NETWORK),
    ("failed to connect", GitUnreachable, _FIX_NETWORK),
    ("connection refused", GitUnreachable, _FIX_NETWORK),
    ("connection timed out", GitUnreachable, _FIX_NETWORK),
    ("connection reset", GitUnreachable, _FIX_NETWORK),
    ("network is unreachable", GitUnreachable, _FIX_NETWORK),
    ("no route to host", GitUnreachable, _FIX_NETWORK),
    ("the remote end hung up", GitUnreachable, _FIX_NETWORK),
    ("could not read from remote repository", GitUnreachable, _FIX_NETWORK),
)
# A rejected push whose reason means "someone else updated the ref first": re-render and retry.
_LOST_RACE = ("fetch first", "non-fast-forward", "stale info", "cannot lock ref",
              "failed to lock", "failed to update ref", "incorrect old value")


@dataclass(frozen=True)
class Identity:
    """Author and committer of the controller's commits."""

    name: str = "gpushare-controller"
    email: str = "gpushare@localhost"


DEFAULT_IDENTITY = Identity()


@dataclass(frozen=True)
class Result:
    code: int
    stdout: bytes
    stderr: str


@dataclass(frozen=True)
class PushOutcome:
    """`pushed`, `present` (the remote already had this very commit: another writer pushed it), `stale` (a
    newer upstream won: retry), `refused` (do not retry)."""

    status: Literal["pushed", "present", "stale", "refused"]
    detail: str


def blob_id(data: bytes, object_format: str = "sha1") -> str:
    """The id git gives a blob holding `data` (object format `sha1` or `sha256`)."""
    digest = hashlib.new(object_format)
    digest.update(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


def classify(command: str, stderr: str) -> GitError:
    """The typed error for git's failure text (already redacted)."""
    lines = [line.strip() for line in stderr.splitlines()
             if line.strip() and not line.startswith("hint:")]
    summary = " / ".join(lines[-3:]) or "no error output"
    lowered = stderr.lower()
    for needle, error, fix in _FAILURES:
        if needle in lowered:
            return error(f"git {command} failed: {summary}", fix)
    return GitCommandFailed(f"git {command} failed: {summary}",
                            "read git's message; if the work directory is damaged, delete it: the next pass re-clones")


def parse_push(porcelain: str, ref: str) -> PushOutcome | None:
    """The outcome for `ref` in `git push --porcelain` output; None when git printed no line for it."""
    for line in porcelain.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or not fields[1].endswith(":" + ref):
            continue
        flag, summary = fields[0], fields[2]
        if flag == "=":
            return PushOutcome("present", summary)
        if flag != "!":
            return PushOutcome("pushed", summary)
        lost_race = any(reason in summary for reason in _LOST_RACE)
        return PushOutcome("stale" if lost_race else "refused", summary)
    return None


def clean_env(identity: Identity, extra: dict[str, str]) -> dict[str, str]:
    """The process environment minus every GIT_* variable, plus ours."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("GIT_", "GPUSHARE_GIT_")) and key != "SSH_ASKPASS"}
    env.update({
        "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
        "GIT_LITERAL_PATHSPECS": "1",
        "LC_ALL": "C", "LANGUAGE": "C",
        "GIT_AUTHOR_NAME": identity.name, "GIT_AUTHOR_EMAIL": identity.email,
        "GIT_COMMITTER_NAME": identity.name, "GIT_COMMITTER_EMAIL": identity.email,
    })
    env.update(extra)
    return env


class Git:
    """Runs `git -C cwd ...` with a clean environment; raises typed, redacted errors."""

    def __init__(self, cwd: Path, *, identity: Identity, credentials: Credentials | None = None,
                 askpass: Path | None = None, timeout_s: float = 120.0) -> None:
        self.cwd = cwd
        extra = credentials.env(askpass) if credentials is not None and askpass is not None else {}
        self._env = clean_env(identity, extra)
        self._credentials = credentials
        self._timeout_s = timeout_s

    def redact(self, text: str) -> str:
        return redact(text, self._credentials.secrets() if self._credentials is not None else ())

    def run(self, *args: str, ok_codes: tuple[int, ...] = (0,), stdin: bytes | None = None,
            config: dict[str, str] | None = None, env: dict[str, str] | None = None) -> Result:
        """Run git (with `config` as `-c key=value`, `env` added to the clean environment).

        An exit code outside `ok_codes` raises the classified error.
        """
        argv = ["git"]
        for key, value in {"credential.helper": "", **(config or {})}.items():
            argv += ["-c", f"{key}={value}"]
        argv += ["-C", str(self.cwd), *args]
        if log.isEnabledFor(logging.DEBUG):
            log.debug("git %s", self.redact(" ".join(args)))
        proc = subprocess.Popen(argv, env={**self._env, **(env or {})}, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            stdout, stderr_bytes = proc.communicate(stdin, timeout=self._timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise GitUnreachable(f"git {args[0]} did not finish within {self._timeout_s:g} s",
                                 _FIX_NETWORK) from None
        stderr = self.redact(stderr_bytes.decode("utf-8", errors="replace")) if stderr_bytes else ""
        if proc.returncode not in ok_codes:
            raise classify(args[0], stderr)
        return Result(proc.returncode, stdout, stderr)

    def text(self, *args: str) -> str:
        """stdout of a successful git command, decoded and stripped."""
        return self.run(*args).stdout.decode("utf-8", errors="replace").strip()
