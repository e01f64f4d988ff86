"""The CLI keeps kubectl's and terraform's habits: --version, NS/NAME, validate on files (a pre-commit hook), plan
exit codes and --detailed-exitcode, -o wide, --repo defaulting to `.`, timestamped or JSON log lines, progress on
a terminal, quantities ready to paste and rounded the safe way, and diagnostics that name the true cause."""
from __future__ import annotations

import io
import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from contract.quantity import parse_bytes
from controller.cli import logs
from controller.cli.commands import main
from controller.cli.reconcile_cmd import seed_remote
from controller.inputs.reader import read_repo
from controller.planning.plan import plan
from tests.conftest import REPO_ROOT
from tests.test_cli import run

FLEET = REPO_ROOT / "examples" / "fleet"
CHAT_FILE = FLEET / "models" / "llm" / "chat.yaml"


@pytest.fixture
def fleet(tmp_path) -> Path:
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    return root


def test_version_prints_the_distribution_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and re.fullmatch(r"gpushare \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)


# --- NS/NAME and --repo defaulting to . ------------------------------------------------------------------

@pytest.mark.parametrize("argv, code, words", [
    pytest.param(["explain", "llm/chat-small"], 0, "llm/chat-small: Qwen/Qwen2.5-0.5B-Instruct", id="ns-slash-name"),
    pytest.param(["explain", "chat-small", "-n", "llm"], 0, "llm/chat-small:", id="name-and-namespace-flag"),
    pytest.param(["explain", "llm/chat-small", "-n", "research"], 2, "-n says 'research'", id="conflicting-namespace"),
    pytest.param(["explain", "a/b/c"], 2, "neither NAME nor NS/NAME", id="too-many-slashes"),
    pytest.param(["explain", "research/chat-small"], 1, "[ModelNotFound]", id="wrong-namespace-is-not-found"),
])
def test_models_are_named_ns_slash_name_and_the_repo_defaults_to_cwd(capsys, monkeypatch, argv, code, words):
    monkeypatch.chdir(FLEET)  # no --repo: `.`
    got, out, err = run(capsys, *argv)
    assert got == code and words in out + err


# --- validate as a pre-commit hook ----------------------------------------------------------------------

def test_validate_checks_single_files_by_kind(capsys):
    code, out, _ = run(capsys, "validate", str(CHAT_FILE), str(FLEET / "gpus.yaml"),
                       str(REPO_ROOT / "templates" / "compositions" / "kai.yaml"))
    assert code == 0 and out.strip().endswith("2 ElasticModel(s), 0 profile(s), 2 GPU slot(s), 1 composition(s); "
                                              "0 error(s)")


@pytest.mark.parametrize("text, reason", [
    pytest.param("apiVersion: gpushare.dev/v1alpha1\nkind: ElasticModel\nmetadata: {name: x}\n"
                 "spec: {model: org/m, memoryBudget: 4Gi, mode: swap}\n", "ModeNotAllowed", id="mode-set"),
    pytest.param("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "UnknownKind", id="not-ours"),
    pytest.param("kind: [unclosed\n", "InvalidYAML", id="broken-yaml"),
])
def test_validate_a_bad_file_exits_1_naming_file_and_reason(capsys, tmp_path, text, reason):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    code, out, _ = run(capsys, "validate", str(bad))
    assert code == 1 and str(bad) in out and f"[{reason}]" in out


def test_validate_finds_a_model_defined_in_two_files(capsys, tmp_path):
    copy = tmp_path / "copy.yaml"
    copy.write_text(CHAT_FILE.read_text())
    code, out, _ = run(capsys, "validate", str(CHAT_FILE), str(copy))
    assert code == 1 and "llm/chat-small" in out


def test_validate_a_directory_of_models(capsys, monkeypatch):
    monkeypatch.chdir(FLEET)
    code, out, _ = run(capsys, "validate", "models/")  # what docs/guide.md runs
    assert code == 0 and "8 ElasticModel(s)" in out


# --- plan exit codes ------------------------------------------------------------------------------------

def test_plan_exits_1_on_input_errors(capsys, fleet):
    (fleet / "models" / "broken.yaml").write_text("kind: [unclosed\n")
    code, out, err = run(capsys, "plan", str(fleet))
    assert code == 1 and "1 input error(s)" in err and "gpu-node-1/gpu0" in out  # the rest is still planned


def test_detailed_exitcode_is_2_with_changes_and_0_without(capsys, fleet, tmp_path):
    assert run(capsys, "plan", str(fleet), "--detailed-exitcode")[0] == 2  # nothing decided yet
    remote = seed_remote(fleet, tmp_path)
    assert run(capsys, "reconcile", "--offline", "--once", "--repo", str(remote),
               "--workdir", str(tmp_path / "controller"))[0] == 0
    checkout = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", str(remote), str(checkout)], check=True)
    assert run(capsys, "plan", str(checkout), "--detailed-exitcode")[0] == 0  # the committed decisions hold
    assert run(capsys, "plan", str(checkout))[0] == 0  # without the flag: 0 either way


def test_plan_wide_shows_footprint_latencies_and_the_profile_source(capsys):
    code, out, _ = run(capsys, "plan", str(FLEET), "-o", "wide")
    header = next(line for line in out.splitlines() if line.strip().startswith("NAME"))
    assert code == 0 and header.split() == ["NAME", "MODEL", "BUDGET", "NEED", "FOOTPRINT", "MODE", "LAYERS",
                                            "TTFT(ALONE/ALL-BUSY)", "TPOT(ALONE/ALL-BUSY)", "SWAP-IN",
                                            "SLO(ALL-BUSY)", "PROFILE"]
    row = next(line for line in out.splitlines() if line.strip().startswith("llm/coder-32b"))
    assert row.split()[-1] == "estimated" and row.split()[4] == "66.0Gi"


# --- quantities ready to paste, rounded the safe way ------------------------------------------------------

def quantity_after(text: str, words: str) -> str:
    return re.search(re.escape(words) + r" ([0-9.]+[KMG]i)", text).group(1)


def replan(fleet: Path, name: str, budget: str) -> str:
    """The mode of `name` once its memoryBudget is `budget`."""
    for path in (fleet / "models").rglob("*.yaml"):
        docs = list(yaml.safe_load_all(path.read_text()))
        for doc in docs:
            if doc["metadata"]["name"] == name:
                doc["spec"]["memoryBudget"] = budget
        path.write_text(yaml.safe_dump_all(docs))
    snapshot = read_repo(fleet)
    inputs, _ = snapshot.planned()
    return next(d.mode for d in plan(inputs, snapshot.last.previous).decisions if d.name == name)


def test_a_pasted_minimum_budget_is_enough_because_it_is_rounded_up(capsys, fleet):
    code, out, _ = run(capsys, "explain", "llm/assistant-8b", "--repo", str(fleet))
    whole = quantity_after(out, "it needs memoryBudget")
    assert code == 0 and replan(fleet, "assistant-8b", whole) == "resident"  # 19.5Gi for a 19.4Gi need: whole
    refused = next(d for d in plan(read_repo(fleet).inputs).decisions if d.name == "tiny-70b")
    minimum = quantity_after(refused.reason, "Raise memoryBudget to at least")
    missing = quantity_after(refused.reason, "Missing:")
    assert parse_bytes(minimum) >= refused.budget_bytes + parse_bytes(missing) - (1 << 30) // 10
    assert replan(fleet, "tiny-70b", minimum) == "elastic"


@pytest.mark.parametrize("sentence", ["Missing: 4.1Gi.", "Raise memoryBudget to at least 12.1Gi, or lower"])
def test_a_refusal_gives_one_unit_per_sentence(sentence):
    refused = next(d for d in plan(read_repo(FLEET).inputs).decisions if d.name == "tiny-70b")
    assert sentence in refused.reason and "bytes" not in refused.reason


# --- log lines and progress ------------------------------------------------------------------------------

@pytest.mark.parametrize("log_format", ["text", "json"])
def test_log_lines_carry_a_utc_timestamp(log_format):
    stream = io.StringIO()
    logs.configure(log_format, stream)
    logging.getLogger("gpushare.reconcile").info("no change (main at %s)", "0123456789ab")
    line = stream.getvalue().strip()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    if log_format == "json":
        record = json.loads(line)
        assert re.fullmatch(stamp, record["time"]) and record["message"] == "no change (main at 0123456789ab)"
        assert (record["level"], record["logger"]) == ("INFO", "gpushare.reconcile")
    else:
        assert re.fullmatch(stamp + r" INFO gpushare\.reconcile: no change \(main at 0123456789ab\)", line)


def test_offline_polling_logs_each_pass_as_a_timestamped_json_line(capsys, monkeypatch, fleet, tmp_path):
    remote = seed_remote(fleet, tmp_path)
    monkeypatch.setattr("controller.cli.reconcile_cmd.run_loop",
                        lambda attempt, interval, **kwargs: 0 if attempt().ok and attempt().ok else 1)
    code, out, err = run(capsys, "--log-format", "json", "reconcile", "--offline", "--repo", str(remote),
                         "--interval", "30s", "--workdir", str(tmp_path / "controller"))
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    passes = [line["message"] for line in lines if line["logger"] == "gpushare.reconcile" and line["level"] == "INFO"]
    warned = [line["message"] for line in lines if line["logger"] == "gpushare.reconcile" and line["level"] == "WARNING"]
    assert code == 0 and out == "" and len(passes) == 2
    assert len(warned) == 1 and warned[0].startswith("--write-back direct: ")  # polling straight to main says so
    assert passes[0].startswith("committed ") and passes[1].startswith("no change (main at ")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_the_phase_on_a_terminal_and_nothing_in_a_log():
    terminal, log = Terminal(), io.StringIO()
    for stream in (terminal, log):
        progress = logs.Progress(stream)
        progress("fetching main")
        progress.done()
    assert "fetching main (" in terminal.getvalue() and terminal.getvalue().endswith("\r\033[K")
    assert log.getvalue() == ""


# --- diagnostics that name the true cause ------------------------------------------------------------------

def test_api_server_down_is_not_a_held_lease_and_exits_1(capsys, fleet, tmp_path):
    remote = seed_remote(fleet, tmp_path)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "down",
        "clusters": [{"name": "down", "cluster": {"server": "http://127.0.0.1:9"}}],  # discard port: refused
        "contexts": [{"name": "down", "context": {"cluster": "down", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    code, out, err = run(capsys, "reconcile", "--kube", "--once", "--repo", str(remote), "--kubeconfig",
                         str(kubeconfig), "--workdir", str(tmp_path / "controller"), "--metrics-port", "0")
    assert code == 1 and "[APIServerUnreachable]" in err and "holds the leader Lease" not in out


def test_a_push_to_a_non_bare_checkout_names_the_checked_out_branch(capsys, fleet, tmp_path):
    subprocess.run(["git", "init", "-q", "-b", "main", str(fleet)], check=True)
    subprocess.run(["git", "-C", str(fleet), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(fleet), "commit", "-qm", "fleet"], check=True)
    code, _, err = run(capsys, "reconcile", "--offline", "--once", "--repo", str(fleet),
                       "--workdir", str(tmp_path / "controller"))
    assert code == 1 and "non-bare repository with main checked out" in err and "bare repository" in err
    assert "branch protection" not in err
