"""A thin, typed wrapper of the git CLI.

Owns how gitops runs git: a clean environment (no user or system config, no
inherited GIT_* variables such as GIT_TRACE_CURL that could log a token, no
terminal prompts, C locale so messages parse), the commit identity, a timeout
that kills git's whole process group, which git commands of this process are
running where (`running_in`: no lock is removed from a work directory while one
runs there), and the mapping of git's failure text to typed errors whose message
names the command, keeps git's whole text (bounded at MAX_GIT_TEXT characters,
both ends kept) and gives the fix. Also parses `git push --porcelain`. Called by
gitops.workcopy only.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import signal
import subprocess
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gitops.credentials import Credentials, redact
from gitops.errors import (BranchNotFound, GitAuthFailed, GitCommandFailed, GitError, GitLocked,
                           GitUnreachable, PartialCloneRefused, RepoNotFound, WorkdirDamaged)

log = logging.getLogger("gpushare.gitops")

_FIX_NETWORK = "check the repository URL and that the git server is up and reachable from here; the next pass retries"
_FIX_AUTH = "check that the token or SSH key Secret is mounted, current, and allowed to read and push this repository"
_FIX_DAMAGED = ("nothing to do by hand: the work directory is the controller's own, and it re-clones it (it says "
                "so in its log); if this persists, check the disk under the work directory")
# (lower-case needle in stderr, error class, fix). First match wins: auth and
# not-found messages arrive together with the generic "Could not read from remote".
_FIX_PARTIAL = ("nothing to do by hand: the controller clones the whole repository instead (it says so in its log); "
                "to keep its work directory small, let the git server speak protocol v2 or set "
                "uploadpack.allowAnySHA1InWant there")
_FAILURES: tuple[tuple[str, type[GitError], str], ...] = (
    # before the damaged-repository needles: git goes on with "unable to read" the object it was refused
    ("does not allow request for unadvertised object", PartialCloneRefused, _FIX_PARTIAL),
    ("upload-pack: not our ref", PartialCloneRefused, _FIX_PARTIAL),
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
    # the local repository itself cannot be read: the controller re-clones its work directory
    ("index file corrupt", WorkdirDamaged, _FIX_DAMAGED),
    ("index file smaller than expected", WorkdirDamaged, _FIX_DAMAGED),
    ("bad index file", WorkdirDamaged, _FIX_DAMAGED),
    ("unknown index entry format", WorkdirDamaged, _FIX_DAMAGED),
    ("not a git repository", WorkdirDamaged, _FIX_DAMAGED),
    ("bad object", WorkdirDamaged, _FIX_DAMAGED),
    ("is corrupt", WorkdirDamaged, _FIX_DAMAGED),
    ("object file ", WorkdirDamaged, _FIX_DAMAGED),  # "object file .git/objects/ab/cd is empty"
    ("unable to read tree", WorkdirDamaged, _FIX_DAMAGED),
    ("unable to read sha1 file", WorkdirDamaged, _FIX_DAMAGED),
    ("unable to parse object", WorkdirDamaged, _FIX_DAMAGED),
    ("missing blob", WorkdirDamaged, _FIX_DAMAGED),
    ("missing tree", WorkdirDamaged, _FIX_DAMAGED),
    ("missing commit", WorkdirDamaged, _FIX_DAMAGED),
    ("invalid object", WorkdirDamaged, _FIX_DAMAGED),
    ("broken link from", WorkdirDamaged, _FIX_DAMAGED),
    ("inflate: data stream error", WorkdirDamaged, _FIX_DAMAGED),
    ("bad config", WorkdirDamaged, _FIX_DAMAGED),
    ("bad signature", WorkdirDamaged, _FIX_DAMAGED),
)
MAX_GIT_TEXT = 2000  # characters of git's text in one error message: its first and last parts beyond
_LOCK_FILE = re.compile(r"unable to create '([^']+\.lock)': file exists", re.IGNORECASE)
_NEW_PART = ("fatal:", "error:", "warning:", "remote:", "!", "to ")  # a line that starts a part of git's text
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SHOWN_ARGS, _SHOWN_ARG_CHARS = 8, 100
_running: Counter[str] = Counter()  # work directory -> git commands of this process running there
_running_lock = threading.Lock()
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
    """The typed error for git's failure text (already redacted) of `command` (as `shown` writes it)."""
    summary = git_text(stderr)
    message = f"git {command} failed: {summary}"
    lock = _LOCK_FILE.search(stderr)
    if lock is not None:
        path = lock.group(1)
        return GitLocked(message, f"{path} is another git process's lock, or was left by one that was killed (a "
                         "controller or git killed mid-command, an OOM kill). Make sure no other git process runs "
                         f"in {_repository_of(path)}: the controller removes a lock nobody holds before its next "
                         f"pass (it logs each one); to go on at once, remove {path}")
    lowered = stderr.lower()
    for needle, error, fix in _FAILURES:
        if needle in lowered:
            return error(message, fix)
    return GitCommandFailed(message, "read git's message above; if the work directory is damaged, delete it: the "
                            "next pass re-clones")


def git_text(stderr: str) -> str:
    """git's failure text on one line: hints left out, each paragraph's lines joined, parts (a `fatal:`, an
    `error:` line) separated by " / ", control characters escaped; at most MAX_GIT_TEXT characters, the first
    two thirds and the last third kept when it is longer (the cause and git's last word both stay)."""
    parts: list[str] = []
    fresh = True
    for raw in stderr.splitlines():
        line = _CONTROL.sub(lambda c: f"\\x{ord(c.group()):02x}", raw.strip())
        if not line:
            fresh = True
            continue
        if line.startswith("hint:"):
            continue
        if fresh or not parts or line.lower().startswith(_NEW_PART):
            parts.append(line)
        else:
            parts[-1] += " " + line
        fresh = False
    text = " / ".join(parts) or "no error output"
    if len(text) <= MAX_GIT_TEXT:
        return text
    head, tail = MAX_GIT_TEXT * 2 // 3, MAX_GIT_TEXT // 3
    return f"{text[:head]} [... {len(text) - head - tail} characters left out ...] {text[-tail:]}"


def shown(args: tuple[str, ...]) -> str:
    """A git command line as error messages show it: the subcommand and its first arguments, each cut short."""
    words = [arg if len(arg) <= _SHOWN_ARG_CHARS else arg[:_SHOWN_ARG_CHARS] + "..." for arg in args[:_SHOWN_ARGS]]
    more = f" (+{len(args) - _SHOWN_ARGS} more arguments)" if len(args) > _SHOWN_ARGS else ""
    return " ".join(words) + more


def running_in(directory: Path) -> int:
    """How many git commands this process runs in `directory` now."""
    with _running_lock:
        return _running[str(directory)]


def _repository_of(lock_path: str) -> str:
    at = lock_path.find("/.git/")
    return lock_path[:at] if at != -1 else str(Path(lock_path).parent)


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
        # git looks for the repository in `cwd` alone: a damaged work directory is an error, never its parent's
        self._env = clean_env(identity, {"GIT_CEILING_DIRECTORIES": str(Path(cwd).resolve().parent), **extra})
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
        where = str(self.cwd)
        with _running_lock:
            _running[where] += 1
        try:
            proc = subprocess.Popen(argv, env={**self._env, **(env or {})}, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            try:
                stdout, stderr_bytes = proc.communicate(stdin, timeout=self._timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise GitUnreachable(f"git {self.redact(shown(args))} did not finish within {self._timeout_s:g} s",
                                     _FIX_NETWORK) from None
        finally:
            with _running_lock:
                _running[where] -= 1
        stderr = self.redact(stderr_bytes.decode("utf-8", errors="replace")) if stderr_bytes else ""
        if proc.returncode < 0:  # a signal: the OOM killer's SIGKILL, most often
            raise GitCommandFailed(f"git {self.redact(shown(args))} was killed by signal {-proc.returncode} "
                                   f"({signal.Signals(-proc.returncode).name}){': ' + git_text(stderr) if stderr else ''}",
                                   "if it was the OOM killer, raise the controller's memory limit; the next pass "
                                   "removes what it left in the work directory and tries again")
        if proc.returncode not in ok_codes:
            raise classify(self.redact(shown(args)), stderr)
        return Result(proc.returncode, stdout, stderr)

    def text(self, *args: str) -> str:
        """stdout of a successful git command, decoded and stripped."""
        return self.run(*args).stdout.decode("utf-8", errors="replace").strip()
