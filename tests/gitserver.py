"""A real git remote for tests and benches: bare repositories served by `git daemon` on 127.0.0.1.

Owns the daemon's lifecycle: started in its own process group on a free port
(or a given one, to come back after a stop), ready when it accepts a TCP
connection, stopped by signalling the whole group so no per-connection child
survives. `filters`: its repositories allow filtered fetches (`uploadpack.allowFilter`, as real forges do,
for a cluster controller's partial clone); a plain daemon refuses them (`both_git_servers` gives each in
turn). Also small helpers that act as a user of the remote (seed a repo, push a commit, read a branch).
`serving()` (and the `git_server` fixture) yields a running server and always stops it. Used by tests/test_gitops_*.py.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitops.git import Identity, clean_env

USER = Identity("a user", "user@example.invalid")
_ENV = clean_env(USER, {})


def git(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> str:
    """Run git as a user would (no user config); stdout, stripped. Raises on failure."""
    done = subprocess.run(["git", *args], cwd=cwd, env=_ENV, input=stdin, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode().strip()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GitServer:
    """`git daemon` serving every bare repository under `base` at git://127.0.0.1:PORT/NAME."""

    def __init__(self, base: Path, port: int | None = None, *, filters: bool = False) -> None:
        self.base = Path(base)
        self.filters = filters
        self.base.mkdir(parents=True, exist_ok=True)
        self._may_move = port is None
        self.port = port or free_port()
        self._proc: subprocess.Popen | None = None
        self._log = self.base.parent / f"{self.base.name}-git-daemon.log"

    def start(self, timeout_s: float = 5.0) -> None:
        """Serve, on the same port as before if this server ran already (clients keep their URL)."""
        for _ in range(3 if self._may_move else 1):
            if self._launch(timeout_s):
                self._may_move = False
                return
            if self._may_move:  # another process took the free port first
                self.port = free_port()
        raise RuntimeError(f"git daemon did not start on port {self.port}: {self._log.read_text()}")

    def _launch(self, timeout_s: float) -> bool:
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(
                ["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
                 f"--base-path={self.base}", "--listen=127.0.0.1", f"--port={self.port}", str(self.base)],
                env=_ENV, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                time.sleep(0.02)
        self.stop()
        return False

    def stop(self) -> None:
        """Signal the daemon's process group (the daemon and its per-connection children)."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc = None

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def path(self, name: str) -> Path:
        return self.base / name

    def create_repo(self, name: str, files: dict[str, bytes], branch: str = "main") -> str:
        """A bare repository whose `branch` holds `files`; its URL. Like most hosts' unprotected
        branches it accepts a forced push, so a test sees a force as lost history."""
        git("init", "-q", "--bare", "-b", branch, str(self.path(name)))
        if self.filters:
            git("config", "uploadpack.allowFilter", "true", cwd=self.path(name))
        self.push_files(name, files, "initial content", branch)
        return self.url(name)

    def push_files(self, name: str, files: dict[str, bytes | None], message: str, branch: str = "main",
                   links: dict[str, str] | None = None) -> str:
        """Commit `files` (bytes, or None to delete) and symlinks `links` (path -> target) on top of
        `branch` as a user, push; the new head."""
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            git("init", "-q", "-b", branch, cwd=work)
            if self.head(name, branch):
                git("fetch", "-q", str(self.path(name)), branch, cwd=work)
                git("reset", "-q", "--hard", "FETCH_HEAD", cwd=work)
            for path, data in files.items():
                (work / path).parent.mkdir(parents=True, exist_ok=True)
                if data is None:
                    (work / path).unlink()
                else:
                    (work / path).write_bytes(data)
            for path, link_target in (links or {}).items():
                (work / path).parent.mkdir(parents=True, exist_ok=True)
                (work / path).symlink_to(link_target)
            git("add", "--all", cwd=work)
            git("commit", "-q", "-m", message, cwd=work)
            git("push", "-q", str(self.path(name)), f"HEAD:refs/heads/{branch}", cwd=work)
            return git("rev-parse", "HEAD", cwd=work)

    def head(self, name: str, branch: str = "main") -> str | None:
        done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"],
                              cwd=self.path(name), env=_ENV, capture_output=True, check=False)
        return done.stdout.decode().strip() or None

    def files(self, name: str, branch: str = "main") -> dict[str, bytes]:
        """Every file on `branch`: path -> content."""
        listing = git("ls-tree", "-r", "--name-only", "-z", branch, cwd=self.path(name))
        return {path: subprocess.run(["git", "show", f"{branch}:{path}"], cwd=self.path(name), env=_ENV,
                                     capture_output=True, check=True).stdout
                for path in listing.split("\0") if path}

    def is_ancestor(self, name: str, ancestor: str, descendant: str) -> bool:
        return subprocess.run(["git", "merge-base", "--is-ancestor", ancestor, descendant],
                              cwd=self.path(name), env=_ENV, check=False).returncode == 0


@contextlib.contextmanager
def serving(base: Path, *, filters: bool = False) -> Iterator[GitServer]:
    """A started GitServer for the repositories under `base`, stopped on exit whatever happens."""
    server = GitServer(base, filters=filters)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def git_server(tmp_path: Path) -> Iterator[GitServer]:
    with serving(tmp_path / "remote") as server:
        yield server


@pytest.fixture(params=[False, True], ids=["remote-refuses-filters", "remote-allows-filters"])
def both_git_servers(request, tmp_path: Path) -> Iterator[GitServer]:
    """A git daemon whose repositories refuse filtered fetches (the controller's copy is a full clone), then one
    whose repositories allow them (a partial clone, as against a forge)."""
    with serving(tmp_path / "remote", filters=request.param) as server:
        yield server
