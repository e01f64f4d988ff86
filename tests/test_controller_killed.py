"""The controller survives any one crash of its own (issue 34): killed with SIGKILL at each git step of a pass,
the next pass recovers its work directory and renders the user's change, nothing lost, nothing force-pushed.

Through the CLI against a real remote (`git daemon` on 127.0.0.1): the controller's first pass has rendered the
example fleet; a user pushes a change (a model's budget); `gpushare reconcile --offline --once` runs with a
`git` wrapper first on its PATH (tests/gitkill.py) that SIGKILLs it at the Nth invocation of one git
subcommand, either while that command holds its lock files and temporaries, or just after it finished (a
push that reached the remote, unrecorded). Then the next pass, with the real git: exit 0, the generated files
on the remote are exactly those of a pass from a fresh work directory, the user's commit is an ancestor of the
remote head (history only grew), the user's files are the user's, no lock is left, and each stale lock
removed is logged. Before issue 34 the next pass failed (`[GitCommandFailed] git reset failed: are terminated
then try again`) and so did every pass after it. Then the same as a property over every invocation of a
pass's trace (hypothesis); and a polling controller whose git alone is killed (the OOM killer's choice)
recovers in its next pass, in the same process."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gitkill
from controller.cli.commands import main
from gitserver import GitServer, git, serving
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]
FLEET = REPO_ROOT / "examples" / "fleet"
CHANGED = "models/llm/assistant-8b.yaml"
GENERATED = ("rendered/", "decisions/")
GPUSHARE = Path(sys.executable).parent / "gpushare"


@dataclass(repr=False)  # hypothesis shows its arguments: the files would be 166 kB of them
class Scene:
    server: GitServer
    url: str
    work: Path
    saved: Path  # the remote and the work directory as they are before the killed pass
    wrapper: Path
    user_head: str
    user_files: dict[str, bytes]
    expected: dict[str, bytes]  # the generated files of a pass from a fresh work directory
    trace: list[str]  # the git subcommands one pass runs, in order

    def __repr__(self) -> str:
        return f"Scene({self.url}, {self.work})"

    def restore(self) -> None:
        for saved, live in ((self.saved / "fleet.git", self.server.path("fleet")), (self.saved / "w", self.work)):
            shutil.rmtree(live, ignore_errors=True)
            shutil.copytree(saved, live, symlinks=True)

    def env(self, kill_at: str | None) -> dict[str, str]:
        """The controller's environment: the killing git first on PATH, set to kill at `kill_at` (or never)."""
        env = {**os.environ, "PATH": f"{self.wrapper}{os.pathsep}{os.environ['PATH']}",
               "KILL_GIT_LOG": str(self.saved / f"trace-{os.getpid()}-{kill_at}")}
        Path(env["KILL_GIT_LOG"]).unlink(missing_ok=True)
        if kill_at is not None:
            env["KILL_GIT_AT"] = kill_at
        return env

    def command(self, *flags: str) -> list[str]:
        return [str(GPUSHARE), "reconcile", "--offline", *flags, "--repo", self.url, "--workdir", str(self.work)]

    def reconcile(self, *, kill_at: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.command("--once"), env=self.env(kill_at), capture_output=True, text=True,
                              timeout=180)


def _owned(files: dict[str, bytes]) -> dict[str, bytes]:
    return {path: data for path, data in files.items() if path.startswith(GENERATED)}


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    base = tmp_path_factory.mktemp("killed")
    with serving(base / "remote") as server:
        url = server.create_repo("fleet", {p.relative_to(FLEET).as_posix(): p.read_bytes()
                                           for p in FLEET.rglob("*") if p.is_file()})
        work = base / "w"
        assert main(["reconcile", "--offline", "--once", "--repo", url, "--workdir", str(work)]) == 0
        text = (FLEET / CHANGED).read_text().replace("memoryBudget: 24Gi", "memoryBudget: 30Gi")
        user_head = server.push_files("fleet", {CHANGED: text.encode()}, "a user raises a budget")
        user_files = {p: d for p, d in server.files("fleet").items() if not p.startswith(GENERATED)}
        saved = base / "saved"
        shutil.copytree(server.path("fleet"), saved / "fleet.git", symlinks=True)
        shutil.copytree(work, saved / "w", symlinks=True)
        scene = Scene(server, url, work, saved, gitkill.install(base / "bin"), user_head, user_files, {}, [])
        traced = scene.reconcile()  # a whole pass, every git call logged: what a fresh pass would commit
        assert traced.returncode == 0, traced.stderr
        scene.trace = Path(next(saved.glob("trace-*"))).read_text().split()
        scene.expected = _owned(server.files("fleet"))
        assert scene.expected["decisions/llm/assistant-8b.yaml"] != _owned_at(saved / "fleet.git", user_head)[
            "decisions/llm/assistant-8b.yaml"], "the user's change must show in what the controller renders"
        yield scene


def _owned_at(bare: Path, commit: str) -> dict[str, bytes]:
    listing = git("ls-tree", "-r", "--name-only", "-z", commit, cwd=bare).split("\0")
    return {path: subprocess.run(["git", "show", f"{commit}:{path}"], cwd=bare, capture_output=True,
                                 check=True).stdout for path in listing if path.startswith(GENERATED)}


def _killed_then_recovered(scene: Scene, kill_at: str, capsys) -> tuple[str, str]:
    """Restore the scene, run the killed pass, then the next one in-process; the next pass's output and log."""
    scene.restore()
    killed = scene.reconcile(kill_at=kill_at)
    assert killed.returncode == -9, (kill_at, killed.returncode, killed.stderr[-2000:])  # the step was reached
    capsys.readouterr()
    code = main(["reconcile", "--offline", "--once", "--repo", scene.url, "--workdir", str(scene.work)])
    out, err = capsys.readouterr()  # the CLI logs to stderr (controller.cli.logs)
    assert code == 0, (kill_at, err[-3000:])
    head = scene.server.head("fleet")
    assert scene.server.is_ancestor("fleet", scene.user_head, head), kill_at  # nothing forced: history grew
    files = scene.server.files("fleet")
    assert _owned(files) == scene.expected, kill_at  # the user's change, rendered as from a fresh directory
    assert {p: d for p, d in files.items() if not p.startswith(GENERATED)} == scene.user_files, kill_at
    left = [p for p in (scene.work / ".git").rglob("*") if p.name.endswith(".lock") or p.name.startswith("tmp_")
            and p.parent.name in ("objects", "pack", "info")]
    assert not left, (kill_at, left)
    return out, err


# (subcommand, its Nth invocation in a pass, what the crash leaves under .git that the next pass must remove)
DURING = [
    ("config", 2, ["config.lock"]),  # setting remote.origin.url as the copy opens
    ("rev-parse", 1, []),
    ("fetch", 1, ["refs/remotes/origin/main.lock", "objects/pack/tmp_pack_killed", "shallow.lock"]),
    ("reset", 1, ["index.lock", "ORIG_HEAD.lock", "HEAD.lock"]),  # issue 34's crash
    ("clean", 1, []),
    ("ls-tree", 1, []),
    ("cat-file", 2, []),
    ("fast-import", 1, ["objects/pack/tmp_pack_killed", "objects/pack/tmp_idx_killed"]),  # the new blobs
    ("fast-import", 2, ["objects/pack/tmp_pack_killed", "refs/gpushare/tree-edit.lock"]),  # the tree edit
    ("commit-tree", 1, []),
    ("push", 1, ["refs/remotes/origin/main.lock", "packed-refs.lock"]),
]


@pytest.mark.parametrize("command,n,leftovers", DURING, ids=[f"during-{c}" + (f"-{n}" if n > 1 and c == "fast-import" else "") for c, n, _ in DURING])
def test_killed_while_git_holds_its_locks_the_next_pass_removes_them_and_renders(scene, capsys, command, n,
                                                                                 leftovers):
    out, log = _killed_then_recovered(scene, f"{command}:{n}:during", capsys)
    assert "committed" in out
    for name in leftovers:
        assert f"removed .git/{name} from the work directory" in log, (command, name)


AFTER = ["fetch", "reset", "clean", "fast-import", "commit-tree", "push"]


@pytest.mark.parametrize("command", AFTER, ids=[f"after-{c}" for c in AFTER])
def test_killed_just_after_a_git_step_the_next_pass_renders_once(scene, capsys, command):
    out, _ = _killed_then_recovered(scene, f"{command}:1:after", capsys)
    if command == "push":  # the commit reached the remote: the next pass finds it there and commits nothing
        assert "no change" in out
        assert scene.server.files("fleet") == {**scene.user_files, **scene.expected}
    else:
        assert "committed" in out


@settings(max_examples=int(os.environ.get("GPUSHARE_FUZZ_EXAMPLES", "6")), deadline=None, database=None,
          derandomize="GPUSHARE_FUZZ_EXAMPLES" not in os.environ, suppress_health_check=list(HealthCheck))
@given(at=st.integers(0, 10_000), mode=st.sampled_from(["during", "after"]))
def test_any_one_crash_at_any_git_call_of_a_pass_is_recovered(scene, capsys, at, mode):
    """The property the fuzzers keep: whichever git call of the pass's trace the controller dies at."""
    index = at % len(scene.trace)
    command = scene.trace[index]
    n = scene.trace[:index + 1].count(command)
    _killed_then_recovered(scene, f"{command}:{n}:{mode}", capsys)


def test_a_polling_controller_whose_git_is_killed_recovers_at_its_next_pass(scene):
    scene.restore()
    loop = subprocess.Popen(scene.command("--interval", "1"), env=scene.env("reset:1:alone"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while _owned(scene.server.files("fleet")) != scene.expected:
            assert loop.poll() is None, loop.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the loop never rendered the user's change"
            time.sleep(0.5)
    finally:
        loop.terminate()
        _, log = loop.communicate(timeout=60)
    assert "git reset -q --hard" in log and "was killed by signal 9 (SIGKILL)" in log  # the first pass, named
    assert "removed .git/index.lock from the work directory" in log  # the next one, recovered
    assert scene.server.is_ancestor("fleet", scene.user_head, scene.server.head("fleet"))
