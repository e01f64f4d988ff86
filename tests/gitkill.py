"""Kill the controller at a chosen git step: a `git` wrapper put first on the controller's PATH (no production code).

The controller runs git as the `git` on its PATH (gitops.git). `install(directory)` writes a wrapper there
that logs each invocation's subcommand to $KILL_GIT_LOG and, at the Nth invocation of the subcommand named in
$KILL_GIT_AT ("SUBCOMMAND:N:MODE"), SIGKILLs its parent (the controller) and:

- `during`: leaves what git leaves when it is killed while that command holds its files, and exits as killed.
  git writes each file by writing its lock (or a temporary) and renaming it into place, so a kill mid-command
  leaves exactly those: the lock files and temporary objects of `HELD` (with partial content), nothing else
  changed. (Killing the real git at the right instant is a race; this is its outcome, made deterministic.)
- `after`: runs the real command to its end first (a push has reached the remote, a commit object is written),
  then kills: the controller dies before it learns the outcome;
- `alone`: as `during`, but only git is killed (the OOM killer's choice): the controller lives on and sees
  its git die, as a polling controller does.

Every other invocation runs the real git. Used by tests/test_controller_killed.py.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

# What each subcommand holds while it runs (under .git); {branch}: the ref it updates.
HELD = {
    "config": ["config.lock"],
    "fetch": ["refs/remotes/origin/{branch}.lock", "objects/pack/tmp_pack_killed", "shallow.lock"],
    "reset": ["index.lock", "ORIG_HEAD.lock", "HEAD.lock"],
    "fast-import": ["objects/pack/tmp_pack_killed", "objects/pack/tmp_idx_killed", "refs/gpushare/tree-edit.lock"],
    "commit-tree": ["objects/4b/tmp_obj_killed"],
    "push": ["refs/remotes/origin/{branch}.lock", "packed-refs.lock"],
    "update-ref": ["packed-refs.lock", "refs/remotes/origin/{branch}.lock"],
}

_WRAPPER = r'''#!{python}
import fcntl, os, re, signal, subprocess, sys
REAL = {real!r}
HELD = {held!r}
args = sys.argv[1:]
at, cwd = 0, os.getcwd()
while at < len(args) and args[at].startswith("-"):
    if args[at] == "-C":
        cwd = args[at + 1]
    at += 2 if args[at] in ("-c", "-C") else 1
command = args[at] if at < len(args) else ""
plan = os.environ.get("KILL_GIT_AT", "::").split(":")
log = os.environ.get("KILL_GIT_LOG")
count = 0
if log:
    with open(log, "a+") as trace:
        fcntl.flock(trace, fcntl.LOCK_EX)
        trace.seek(0)
        count = sum(1 for line in trace if line.strip() == command) + 1
        trace.write(command + "\n")
if command != plan[0] or str(count) != plan[1]:
    os.execv(REAL, [REAL, *args])
if plan[2] == "after":
    code = subprocess.call([REAL, *args])
    os.kill(os.getppid(), signal.SIGKILL)
    sys.exit(code)
branch = next((m.group(1) for a in args for m in [re.search(r"refs/(?:remotes/origin|heads)/([^:]+)$", a)] if m),
              "main")
for name in HELD.get(command, []):  # what git holds by now, written before anything dies
    path = os.path.join(cwd, ".git", name.format(branch=branch))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as partial:
        partial.write(b"written in part by a git that was killed")
if plan[2] != "alone":
    os.kill(os.getppid(), signal.SIGKILL)
os.kill(os.getpid(), signal.SIGKILL)
'''


def install(directory: Path) -> Path:
    """Write the wrapper as `directory/git`; the directory (to put first on PATH)."""
    real = shutil.which("git")
    assert real is not None, "git is not installed"
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / "git"
    wrapper.write_text(_WRAPPER.format(python=sys.executable, real=real, held=HELD))
    wrapper.chmod(0o755)
    return directory
