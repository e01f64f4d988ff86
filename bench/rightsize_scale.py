"""One right-sizing pass for N models against a real Prometheus holding 2 days at 60 s; prints the pass's
seconds and peak resident MiB.

Builds the history with Debian's `promtool tsdb create-blocks-from openmetrics` (each model: its worker's
device bytes, KV cache in use and reserved, and the verdict series every usage query joins for the
namespace), starts `prometheus` on it on 127.0.0.1, then runs the pass in a fresh process, so its peak
resident set is the pass's own: the installed loop's read (controller.rightsizing.prometheus.read_usage:
history peaks per half hour, the last interval and the longest upsizeAfter on the scrape grid, the fleet
filter) and the pure step
(controller.rightsizing.step) for N Auto models on a fleet of GPUs. The data (a few hundred MB for 200
models) is cached under --data, keyed by N. Targets (issue 19): 10,000 models in at most 60 s and
512 MiB; 200 models in at most 5 s.
Run: .venv/bin/python bench/rightsize_scale.py --models 200 [--data /tmp/gpushare-rightsize-scale]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GiB = 1 << 30
STEP_S = 60
WINDOW_S = 2 * 86400
END = 1_796_000_400  # a fixed clock (2026-12-01): the data and the pass agree on "now"
VERDICT_EVERY_S = 240  # inside Prometheus' 5-minute lookback


def _write_openmetrics(path: Path, models: int) -> None:
    rng = random.Random(19)
    start = END - WINDOW_S - 3600
    with path.open("w", encoding="ascii") as out:
        for metric, kind in (("gpushare_worker_device_bytes", "device"), ("gpushare_worker_kv_used_bytes", "kv"),
                             ("gpushare_worker_kv_reserved_bytes", "reserved"), ("gpushare_worker_verdict", "verdict")):
            out.write(f"# TYPE {metric} gauge\n")
            for m in range(models):
                weights, kv = rng.choice((1, 2, 8, 16)) * GiB, int(rng.uniform(0.5, 4) * GiB)
                every = VERDICT_EVERY_S if kind == "verdict" else STEP_S
                labels = f'model="model-{m:05d}",instance="worker-{m // 8}:8000"'
                if kind == "verdict":
                    labels += ',namespace="team",verdict="served"'
                lines = []
                for t in range(start, END + 1, every):
                    load = 0.5 + 0.4 * ((t // 3600 + m) % 24) / 24
                    value = {"device": weights + int(load * kv), "kv": int(load * kv), "reserved": kv,
                             "verdict": 1}[kind]
                    lines.append(f"{metric}{{{labels}}} {value} {t}\n")
                out.writelines(lines)
        out.write("# EOF\n")


def _data(base: Path, models: int) -> Path:
    data = base / f"tsdb-{models}"
    if (data / "done").exists():
        return data
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    source = data / "input.om"
    started = time.perf_counter()
    _write_openmetrics(source, models)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)], check=True,
                   stdout=subprocess.DEVNULL)
    source.unlink()
    (data / "done").write_text("")
    print(f"backfilled {models} models x 2 d at {STEP_S} s in {time.perf_counter() - started:.0f} s")
    return data


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pass(url: str, models: int) -> None:
    """The measured pass, in its own process: read the window, run the step; print one JSON line."""
    from controller.policy import Rightsizing
    from controller.rightsizing.prometheus import DETAIL_S, read_usage
    from controller.rightsizing.step import step
    from controller.rightsizing.usage import by_model
    from controller.types import SLO, ElasticModel, GpuSlot

    policy = Rightsizing(policy="Auto")
    fleet = [ElasticModel(name=f"model-{m:05d}", namespace="team", model="org/m", budget_bytes=24 * GiB,
                          slo=SLO(), gpu_product="NVIDIA-H200", rightsizing=policy) for m in range(models)]
    slots = [GpuSlot(f"node-{i}", 0, "NVIDIA-H200", 141 * GiB) for i in range(max(1, models // 4))]
    started = time.perf_counter()
    usage = read_usage(url, END - WINDOW_S, END, STEP_S, fleet={m.ref: policy.upsize_after_s for m in fleet},
                       detail_s=300 + DETAIL_S, deadline_s=600)
    read_s = time.perf_counter() - started
    result = step(fleet, (), slots, {}, by_model(usage), END, held=usage.held, window_s=WINDOW_S,
                  step_s=usage.step_s, history_until=usage.history_until, acts_after=usage.acts_after)
    took = time.perf_counter() - started
    changed = sum(1 for r in result.records.values() if r.open)
    print(json.dumps({"seconds": took, "read_seconds": read_s, "samples": len(usage), "records": len(result.records),
                      "changed": changed, "held": len(usage.held),
                      "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "gpushare-rightsize-scale")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: run the pass against this URL
    args = parser.parse_args()
    if args.measure:
        _pass(args.measure, args.models)
        return 0
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        print("needs Debian's prometheus package (prometheus, promtool): apt-get install -y prometheus")
        return 2
    print(f"machine: {platform.machine()}, {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}")
    data = _data(args.data, args.models)
    port = _port()
    server = subprocess.Popen(["prometheus", f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=100y",
                               f"--web.listen-address=127.0.0.1:{port}", "--config.file=/dev/null"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as ready:
                    if ready.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        done = subprocess.run([sys.executable, __file__, "--models", str(args.models), "--measure", url],
                              capture_output=True, text=True)
        if done.returncode:
            print(done.stderr[-3000:])
            return 1
        figures = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(30)
    target = (60, 512) if args.models > 200 else (5, 512)
    print(f"{args.models} models, 2 d at {STEP_S} s: one pass {figures['seconds']:.1f} s (read "
          f"{figures['read_seconds']:.1f} s), peak resident {figures['peak_mib']:.0f} MiB; {figures['samples']} "
          f"samples, {figures['records']} records, {figures['changed']} changed, {figures['held']} held "
          f"[{'met' if figures['seconds'] <= target[0] and figures['peak_mib'] <= target[1] else 'missed'}: target "
          f"<= {target[0]} s and <= {target[1]} MiB]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
