"""The parts of a large pass that issue 18 made faster, each against the way it was done before; prints both.

- a decision record read by parse events (controller.inputs.yamlin) against the node path;
- a model's two Services (the shipped model-service template's output) read by their shape
  (controller.rendering.shapes) against a full parse;
- Kubernetes' validators of the shipped kinds compiled without exception details against with them;
- compose in one process over a fleet of --models models, the garbage collector paused against running.
Run: .venv/bin/python bench/pass_parts.py [--models N]   (10,000 by default)
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import fastjsonschema

from reconcile_scale import write_repo

from controller.cpu import collect, gc_paused
from controller.inputs.compositions import shipped_compositions
from controller.inputs.reader import read_repo
from controller.inputs.yamlin import YamlLimits, _from_nodes, parse_documents
from controller.planning.plan import plan
from controller.rendering import compose as compose_module
from controller.rendering import kube_validate, render, shapes
from controller.rendering.yamlout import dump


def per_call_us(function, n: int = 3000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        function()
    return (time.perf_counter() - start) / n * 1e6


def records() -> None:
    doc = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
           "metadata": {"name": "m-00000", "namespace": "team-00", "annotations": {"gpushare.dev/source": "models/a"}},
           "spec": {"model": "meta-llama/Llama-3.1-8B-Instruct", "memoryBudget": 21474836480,
                    "slo": {"concurrency": 2, "contextTokens": 4096}, "gpu": {"product": "NVIDIA-H200"}},
           "status": {"assigned": {"budgetBytes": 21474836480, "estimated": True, "footprintBytes": 17626219561,
                                   "gpu": {"product": "NVIDIA-H200", "slot": "gpu-node-0107/gpu5"}, "hostBytes": 0,
                                   "mode": "resident", "needBytes": 17626219561, "reasonCode": "FitsResident",
                                   "predicted": {"aloneTpotMs": 8.194, "tpotMs": 57.935, "swapInMs": None},
                                   "reason": "need 16.4Gi (weights 15.0Gi + KV 1.0Gi for 4096\u00d72 tokens)",
                                   "residentLayers": 32, "sloMet": None, "totalLayers": 32}}}
    text, limits = dump(doc), YamlLimits.from_env()
    events = per_call_us(lambda: parse_documents(text, unique_keys=True, limits=limits))
    nodes = per_call_us(lambda: _from_nodes(text, True, limits))
    print(f"a decision record read: by events {events:.0f} us, by nodes {nodes:.0f} us ({nodes / events:.1f}x)")


def services() -> None:
    composition = shipped_compositions()["default"]
    env = render.compiled(composition.templates)
    context = {"params": composition.parameters, "worker": {"namespace": "gpushare-system", "name": "worker-a"},
               "model": {"name": "m", "namespace": "team", "ref": "team/m", "model": "Qwen/X", "revision": "main"},
               "service": {"name": "s-team-m", "target": "s.gpushare-system.svc.cluster.local",
                           "url": "http://m.team.svc/v1"}}
    text = env.get_template("model-service.yaml.j2").render(**context)
    shapes.read_output(text)  # the first render of the shape keeps it
    by_shape = per_call_us(lambda: shapes.read_output(text))
    full = per_call_us(lambda: [(doc, dump(doc)) for doc in parse_documents(text)])
    print(f"a model's two Services read and written canonically: by shape {by_shape:.0f} us, full parse and "
          f"write {full:.0f} us ({full / by_shape:.1f}x)")


def validators() -> None:
    def compile_all(detailed: bool) -> float:
        original = fastjsonschema.compile
        if detailed:  # as before issue 18: every failure carries its details
            fastjsonschema.compile = lambda *a, **k: original(*a, **{**k, "detailed_exceptions": True})
        kube_validate._fast.cache_clear()
        start = time.perf_counter()
        try:
            for api_version, kind in compose_module.SHIPPED_KINDS:
                kube_validate._fast(kube_validate.KUBERNETES_VERSION, api_version, kind)
        finally:
            fastjsonschema.compile = original
        return time.perf_counter() - start

    compile_all(False)  # the schema files read once
    plain, detailed = compile_all(False), compile_all(True)
    print(f"Kubernetes validators of {len(compose_module.SHIPPED_KINDS)} kinds compiled: without exception details "
          f"{plain:.2f} s, with them {detailed:.2f} s ({detailed / plain:.1f}x)")


def collector(models: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="gpushare-parts-"))
    try:
        write_repo(base, models, max(8, models // 10))
        tree = read_repo(base)
        result = plan(tree.inputs, None)

        def compose_s() -> float:
            start = time.process_time()
            compose_module.compose(tree.inputs.models, result, tree.inputs.slots, compositions=tree.compositions)
            return time.process_time() - start

        compose_s()  # templates and shapes warm
        running = [compose_s() for _ in range(2)]
        with gc_paused():
            paused = [compose_s() for _ in range(2)]
        collect()
        print(f"compose in one process, {models} models: CPU {min(running):.2f} s with the garbage collector "
              f"running, {min(paused):.2f} s paused ({min(paused) / min(running) - 1:+.0%})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10_000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    records()
    services()
    validators()
    collector(args.models)


if __name__ == "__main__":
    main()
