"""The parts of a large pass that issue 18 made faster, each against the way it was done before; prints both.

- a decision record read by parse events (controller.inputs.yamlin) against the node path, and a fleet's
  records (each one different) read by their canonical layout (controller.inputs.canonical) against parse events;
- a model's two Services (the shipped model-service template's output) read by their shape
  (controller.rendering.shapes) against a full parse;
- a worker's config (multi-line text) quoted for its ConfigMap by three replaces against an escape per character,
  and read back (controller.rendering.shapes) as JSON against an escape at a time;
- a held prune's check of every upstream path against the kept paths (gitops.paths.Prefixes) against a scan of
  them per path;
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
from controller.inputs.canonical import decode_escapes, from_canonical
from controller.inputs.yamlin import YamlLimits, _from_events, _from_nodes, parse_documents
from controller.planning.plan import plan
from controller.rendering import compose as compose_module
from controller.rendering import kube_validate, quote, render, shapes
from controller.rendering.yamlout import dump
from gitops.paths import Prefixes


def per_call_us(function, n: int = 3000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        function()
    return (time.perf_counter() - start) / n * 1e6


def record(i: int) -> dict:
    """The i-th of a fleet's decision records: names, sizes and predictions differ from record to record."""
    budget, footprint = (8 << 30) * (1 + i % 5), 9_000_000_000 + 7_919 * i
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
            "metadata": {"name": f"m-{i:05d}", "namespace": f"team-{i % 100:02d}",
                         "annotations": {"gpushare.dev/source": f"models/team-{i % 100:02d}/m-{i:05d}.yaml"}},
            "spec": {"model": "meta-llama/Llama-3.1-8B-Instruct", "memoryBudget": budget,
                     "slo": {"concurrency": 1 + i % 4, "contextTokens": 4096}, "gpu": {"product": "NVIDIA-H200"}},
            "status": {"assigned": {"budgetBytes": budget, "estimated": True, "footprintBytes": footprint,
                                    "gpu": {"product": "NVIDIA-H200", "slot": f"gpu-node-{i % 1000:04d}/gpu{i % 8}"},
                                    "hostBytes": 0, "mode": "resident", "needBytes": footprint,
                                    "reasonCode": "FitsResident",
                                    "predicted": {"aloneTpotMs": 5 + i % 997 / 71, "tpotMs": 20 + i % 991 / 13,
                                                  "swapInMs": None},
                                    "reason": f"need {footprint / 2**30:.1f}Gi (weights 15.0Gi + KV 1.0Gi for "
                                              f"4096\u00d7{1 + i % 4} tokens)",
                                    "residentLayers": 32, "sloMet": None, "totalLayers": 32}}}


def records(count: int = 2000) -> None:
    text, limits = dump(record(0)), YamlLimits.from_env()
    events = per_call_us(lambda: _from_events(text, True, limits))
    nodes = per_call_us(lambda: _from_nodes(text, True, limits))
    print(f"a decision record read: by events {events:.0f} us, by nodes {nodes:.0f} us ({nodes / events:.1f}x)")

    def each_us(read, texts: list[str]) -> float:
        start = time.perf_counter()
        for one in texts:
            read(one)
        return (time.perf_counter() - start) / len(texts) * 1e6

    batches = [[dump(record(i)) for i in range(start, start + count)] for start in range(0, 4 * count, count)]
    times = {}
    paths = (("canonical", lambda t: from_canonical(t, limits)), ("events", lambda t: _from_events(t, True, limits)))
    for name, read in paths:
        each_us(read, batches[0])  # lines and scalars common to every record cached, as after a fleet's first records
        times[name] = min(each_us(read, fresh) for fresh in batches[1:])  # each record read once
    print(f"{count} other decision records read: by the canonical layout {times['canonical']:.0f} us each, "
          f"by events {times['events']:.0f} us each ({times['events'] / times['canonical']:.1f}x)")


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


def config_quote() -> None:
    config = "".join(dump(record(i)["status"]) for i in range(8))  # multi-line ASCII, like a slot's worker.yaml
    replaces = per_call_us(lambda: quote._escaped(config), 1000)
    per_character = per_call_us(lambda: quote._NEEDS_ESCAPE.sub(quote._escape, config), 1000)
    print(f"a worker's config of {len(config):,} characters quoted: by replaces {replaces:.0f} us, an escape per "
          f"character {per_character:.0f} us ({per_character / replaces:.1f}x)")
    inside = quote._escaped(config)
    assert shapes._unescape(inside, True) == config
    by_json = per_call_us(lambda: shapes._unescape(inside, True), 1000)
    per_escape = per_call_us(lambda: shapes._ESCAPED.match(inside) and decode_escapes(inside), 1000)
    print(f"  and read back from its shape: as JSON {by_json:.0f} us, checked and decoded an escape at a time "
          f"{per_escape:.0f} us ({per_escape / by_json:.1f}x)")


def held_prune(paths: int = 5000) -> None:
    upstream = [f"rendered/team-{i % 50:02d}/service-m-{i:05d}.yaml" for i in range(paths)]
    kept = frozenset(upstream)  # a held prune keeps every generated path as upstream has it

    def scanned(path: str) -> bool:  # the check as it was: each kept path in turn
        return any(path == prefix or (prefix.endswith("/") and path.startswith(prefix)) for prefix in kept)

    start = time.perf_counter()
    index = Prefixes(kept)
    assert all(index.holds(path) for path in upstream)
    by_index = time.perf_counter() - start
    start = time.perf_counter()
    assert all(scanned(path) for path in upstream)
    by_scan = time.perf_counter() - start
    print(f"a held prune of {paths:,} paths, each checked against the kept ones: by index {by_index * 1000:.1f} ms, "
          f"by scan {by_scan:.2f} s ({by_scan / by_index:,.0f}x; the scan grows with the square of the paths)")


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
    config_quote()
    held_prune()
    validators()
    collector(args.models)


if __name__ == "__main__":
    main()
