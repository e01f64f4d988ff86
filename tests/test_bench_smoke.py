"""The benchmarks run here: bench/worker_gpu.py --cpu-smoke prints its whole table; profile_gpu.py
resolves every import and says it needs CUDA; usage_read.py runs from any directory. The numbers are
CPU numbers; no target is judged here."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

ROWS = [  # the table bench/worker_gpu.py promises (issue 10, "How we will know")
    "HBM bandwidth", "decode roofline", "resident ms/token, C=1",
    *(f"{mode} aggregate tokens/s, C={c}" for mode in ("resident", "elastic") for c in (1, 8, 32)),
    "elastic step ms, C=8", "resident TPOT p99 beside elastic decode", "swap-in",
    "predicted TPOT, C=1", "predicted TPOT, C=8",
]
TARGETS = ["<= 1.3", ">= 6.0", "<= 1.2", "<= 1.5", "0.85..1.15"]


def run(*argv: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd="/", capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_worker_bench_cpu_smoke_prints_every_row_with_its_target_labelled_cpu():
    done = run(str(REPO_ROOT / "bench" / "worker_gpu.py"), "--cpu-smoke")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("device: CPU (smoke run")
    for row in ROWS:
        (line,) = [line for line in lines if line.startswith(row)]
        assert line.rstrip().endswith("|") or line.rstrip().endswith("-"), f"{row}: a CPU run judges no target"
    table = "\n".join(lines)
    assert all(target in table for target in TARGETS)
    assert "decodeStepMs by batch: 1: " in table and ", 8: " in table  # profiled through the engine up to C=8


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="with CUDA the bench runs for real")
def test_profile_bench_resolves_its_imports_and_needs_cuda():
    done = run(str(REPO_ROOT / "bench" / "profile_gpu.py"), timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "no CUDA device is visible" in done.stderr


def test_usage_read_bench_runs_from_anywhere_and_prints_its_figures():
    done = run(str(REPO_ROOT / "bench" / "usage_read.py"), "--models", "3", "--window-hours", "1", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.splitlines()[-1]
    assert last.startswith("3 models, 1 h at 60 s: ") and "samples, 10 queries" in last and "peak resident" in last


def test_engine_ops_bench_counts_within_its_targets():
    """The counted figures of bench/engine_ops.py (no timing): operators per layer, host syncs per step, KV read."""
    done = run(str(REPO_ROOT / "bench" / "engine_ops.py"), "--skip-http", timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("operators per decoder layer per decode step: ") for line in lines)
    assert any(line.startswith("host syncs per decode step (temperature 1, top-p, penalties): 1 ") for line in lines)
    assert lines[-1] == '{"missed": []}'


def test_grammar_mask_bench_prints_a_row_per_vocabulary():
    done = run(str(REPO_ROOT / "bench" / "grammar_masks.py"), "--vocab", "258", "--steps", "20", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    header, _, row = done.stdout.splitlines()[-3:]
    assert header.startswith("| vocab | tokenizer view ms") and row.startswith("| 258 | ") and row.count("|") == 8


def test_quantized_bench_streams_half_the_bytes_in_int8_and_a_quarter_in_int4():
    """bench/quantized.py on one decoder layer: the streamed bytes per token (counted, not timed) are within its
    targets, and the CUDA-only rows (int8 resident ÷ bfloat16 on a GPU, the PCIe floor target) are not judged."""
    done = run(str(REPO_ROOT / "bench" / "quantized.py"), "--layers", "1", "--steps", "1", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()
            if line.split() and line.split()[0] in ("bfloat16", "int8", "int4")}
    assert float(rows["int8"][3]) <= 0.51 and float(rows["int4"][3]) <= 0.30
    assert rows["bfloat16"][1] == rows["bfloat16"][2]  # a step streams every decoder byte once
    assert "missed: []" in done.stdout


def test_plan_benches_build_their_fleets_from_the_shipped_profiles():
    """bench/plan_scale.py and bench/capacity.py draw their fleets from examples/fleet's profiles of each model's
    own precision: a profile added beside them (the int8 and int4 ones) must not break the draw or the mix."""
    done = run(str(REPO_ROOT / "bench" / "plan_scale.py"), "--models", "200", "--slots", "20", "--repeat", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "plan 200 models over 20 slots: " in done.stdout
    done = run(str(REPO_ROOT / "bench" / "capacity.py"), "--fleets", "10", "--models", "50", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refusals 0 (exact 0)" in done.stdout and "50 models on an H200 pool" in done.stdout


@pytest.mark.slow
def test_many_cluster_bench_prints_each_controller_and_every_verdict():
    """bench/reconcile_scale.py --clusters: a row per controller in both tables, the ratios to the alone runs beside
    each controller in either layout without a verdict, a verdict per measure on the medians over the rounds against
    the median of every alone run in the same layout with the resolution beside it, and the spread of the alone
    runs (what the measurement can tell apart); no target is judged here."""
    done = run(str(REPO_ROOT / "bench" / "reconcile_scale.py"), "--clusters", "2", "--models", "10", "--repeat", "2",
               timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| c-00 |", "| c-01 |"))]
    assert len(rows) == 4 and all(row.count("|") in (16, 10) for row in rows), rows
    lines = done.stdout.splitlines()
    for what in ("full pass", "re-render", "nothing new"):
        for against, note in (("one cluster alone in the clusters/ layout:", "the least of each beside it"),
                              ("one cluster alone:", "no target")):
            line = [x for x in lines if x.startswith(f"{what} (CPU), each controller against {against} median ")]
            assert len(line) == 1 and note in line[0] and "target <=" not in line[0], (what, against, line)
        verdict = [x for x in lines if x.startswith(
            f"{what} (CPU), each controller's median of its 2 runs against the median of all 4 of one cluster alone "
            "in the clusters/ layout")]
        assert len(verdict) == 1 and ("[met: target <= 1.2x" in verdict[0] or "[MISSED: target <= 1.2x" in verdict[0])
        resolution = [x for x in lines if x.startswith(
            "the measurement's resolution: one cluster alone, the median of its 2 runs beside each controller against "
            f"the median of all, the same {what}: ")]
        assert len(resolution) == 1, (what, resolution)
    assert done.stdout.count("the measurement's own spread: one cluster alone") == 2
    assert done.stdout.count("(CPU) for each cluster more in the repository: ") == 2
    assert "(the least of 2 runs of each" in done.stdout
