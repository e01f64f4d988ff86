"""docs/guide.md, followed start to finish: every command it shows runs here as written, except those that need a
cluster (kubectl, ssh-keyscan, `reconcile --kube`), which are listed and skipped on purpose; the files it shows are
written where it says; each result is checked. A new command in the guide fails this test until it is handled."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import validate

from controller.cli.commands import main
from tests.conftest import REPO_ROOT

GUIDE = REPO_ROOT / "docs" / "guide.md"
FLEET = REPO_ROOT / "examples" / "fleet"
# A cluster, or a Prometheus: `usage export` reads one and the replay after it reads its export (the
# replay itself is tested on recorded series in tests/test_rightsizing_pass.py).
NEEDS_A_CLUSTER = ("kubectl ", "ssh-keyscan ", "gpushare reconcile --kube",
                   "gpushare rightsize --repo https://", "gpushare consolidate --repo https://",
                   "gpushare usage export ", "gpushare rightsize --repo ./fleet --usage usage.jsonl")


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(), re.S)


def commands() -> list[str]:
    """Each shell command of the guide, continuation lines joined, comments and output lines dropped."""
    found = []
    for block in blocks("sh"):
        text = re.sub(r"\\\n\s*", " ", block)
        for line in text.splitlines():
            line = line.split("  #", 1)[0].split(" # ", 1)[0].strip()
            if line and not line.startswith("#"):
                found.append(line)
    return found


@pytest.fixture
def user_repo(tmp_path) -> tuple[Path, Path]:
    """A user's fleet checkout (a GPU inventory and estimated profiles, no models yet) and its bare remote."""
    remote, work = tmp_path / "fleet.git", tmp_path / "fleet"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    work.mkdir()
    shutil.copy(FLEET / "gpus.yaml", work / "gpus.yaml")
    shutil.copytree(FLEET / "profiles", work / "profiles")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "fleet: inventory and profiles"],
                 ["remote", "add", "origin", str(remote)], ["push", "-q", "-u", "origin", "main"]):
        subprocess.run(["git", "-C", str(work), *args], check=True)
    return work, remote


def test_the_guide_runs_start_to_finish(user_repo, capsys, monkeypatch, tmp_path):
    work, remote = user_repo
    ran, skipped = [], []
    for command in commands():
        if command.startswith(NEEDS_A_CLUSTER):
            skipped.append(command)
            continue
        if command.startswith("make install.yaml"):
            _make_install_yaml(command, tmp_path)
        elif command.startswith("gpushare "):
            _write_shown_files(work)  # the YAML the guide shows just before, at the path its comment names
            monkeypatch.chdir(work)
            _gpushare(command, capsys)
        elif command == ".venv/bin/python bench/capacity.py --table":
            _bench_table()
        elif command.startswith("git add "):
            subprocess.run(command, shell=True, cwd=work, check=True, capture_output=True)
            pushed = subprocess.run(["git", "-C", str(remote), "show", "main:models/llm/chat-small.yaml"],
                                    check=True, capture_output=True, text=True).stdout
            assert yaml.safe_load(pushed)["metadata"]["name"] == "chat-small"
        else:
            pytest.fail(f"docs/guide.md shows a command this test does not know: {command!r}")
        ran.append(command.split()[0:2])
    assert [c[:2] for c in ran] == [["make", "install.yaml"], ["gpushare", "validate"], ["git", "add"],
                                    ["gpushare", "explain"], ["gpushare", "consolidate"],
                                    [".venv/bin/python", "bench/capacity.py"]]
    assert all(c.startswith(NEEDS_A_CLUSTER) for c in skipped) and len(skipped) >= 8


def _make_install_yaml(command: str, tmp_path: Path) -> None:
    """`make install.yaml REGISTRY=...` as the guide writes it (the venv stamp is taken as made), then the
    manifest `kubectl apply -f install.yaml` would apply, validated strictly instead."""
    target = REPO_ROOT / "install.yaml"
    kept = target.read_bytes() if target.exists() else None  # a developer's own render survives the test
    words = shlex.split(command) + ["-B", "-o", ".venv/.core-stamp", f"PY={sys.executable}"]
    try:
        subprocess.run(words, cwd=REPO_ROOT, check=True, capture_output=True)
        docs = [d for d in yaml.safe_load_all(target.read_text()) if d]
    finally:
        target.write_bytes(kept) if kept is not None else target.unlink(missing_ok=True)
    for doc in docs:
        validate(doc, "1.30", strict=True)
    registry = dict(w.split("=", 1) for w in shlex.split(command) if "=" in w)["REGISTRY"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].startswith(f"{registry}/gpushare-controller:")
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config["data"]["WORKER_IMAGE"].startswith(f"{registry}/gpushare-worker:")


def _gpushare(command: str, capsys) -> None:
    capsys.readouterr()
    code = main(shlex.split(command)[1:])
    out = capsys.readouterr().out
    if command.startswith("gpushare validate"):
        assert code == 0 and re.search(r"\d+ ElasticModel\(s\).*; 0 error\(s\)", out), out
    elif command == "gpushare consolidate .":  # the guide's fleet has no pool: nothing to give back
        assert code == 0 and out.startswith("nothing to give back"), out
    elif command.startswith("gpushare explain"):
        assert code == 0 and "llm/chat-small: Qwen/Qwen2.5-0.5B-Instruct" in out and "Mode: resident" in out, out
    else:
        pytest.fail(f"no expectation for {command!r}")


def _bench_table() -> None:
    """The guide's cost table is what bench/capacity.py prints, row for row."""
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "capacity.py"), "--table"], cwd="/",
                          capture_output=True, text=True, timeout=300, check=True)
    rows = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert len(rows) == 6 and all(row in GUIDE.read_text() for row in rows), done.stdout


def _write_shown_files(work: Path) -> None:
    for block in blocks("yaml"):
        first = block.splitlines()[0]
        if first.startswith("# models/"):
            path = work / first.removeprefix("# ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block)
