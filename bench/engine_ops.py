"""The engine's per-step costs on CPU, counted rather than timed, and batching through the HTTP path.

    python bench/engine_ops.py [--skip-http] [--requests 8] [--tokens 48]

For a llama-shaped random model with resident decode (the engine's own forward, engine/), prints:
- operators per decoder layer per decode step, counted with a torch dispatch mode (the aten and
  engine operators that reach the dispatcher; view operators, which launch nothing, listed apart),
  as the difference between a 4-layer and a 2-layer model of the same shape, halved;
- host syncs per decode step at temperature 1 with top-p and frequency/presence/repetition penalties:
  the dispatched operators that make the host wait for the device on CUDA (device-to-host copies,
  `.item()`/`int()`/`.tolist()` of a device tensor, `nonzero`);
- the KV bytes attention reads per decode step in an 8K-token context holding 200 tokens (the key and
  value operands of the attention operators), against the KV bytes those 200 tokens hold;
and, through `python -m worker` on CPU with a tiny model, the aggregate tokens/s of `--requests`
concurrent greedy requests against one request alone (non-streamed completions over HTTP from one shared
connection pool; the worker runs with its default settings, no OMP_NUM_THREADS: it chooses its intra-op
threads itself, worker/threads.py; `--threads N` passes --intra-op-threads N instead), beside the same ratio
stepping the engine alone in this process (what the HTTP path can at best keep).
Targets: <= 16 operators per layer, <= 1 host sync per step, KV read <= 2x held, >= 4x aggregate.
Exit status 1 when a target is missed. The CPU timings are noisy on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
             max_position_embeddings=8192)
CONTEXT, HELD = 8192, 200
SYNC_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
            "aten.item.default"}


def counted(fn):
    """Run `fn` under a dispatch mode; returns (operators, views, host syncs, KV bytes read by attention)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.views, self.syncs, self.kv_read = [], [], 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = str(func)
            (self.views if func.is_view else self.ops).append(name)
            copy = name.startswith(("aten._to_copy", "aten.to."))
            if name in SYNC_OPS or (copy and str(kwargs.get("device")) == "cpu"):
                self.syncs += 1
            if "scaled_dot_product" in name:
                self.kv_read += sum(a.numel() * a.element_size() for a in args[1:3])
            return func(*args, **kwargs)

    with torch.inference_mode(), Count() as count:
        fn()
    return count


def llama(layers: int):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(num_hidden_layers=layers, **SHAPE),
                                            dtype=torch.float32).eval()


def resident_engine(model, *, concurrency: int, context: int):
    import torch

    from engine.batch import ModelEngine
    from engine.memory import DeviceLedger
    from engine.residency import make_residency

    cpu = torch.device("cpu")
    residency = make_residency("resident", model, DeviceLedger("bench", 1 << 40, cpu), cpu)
    residency.load()
    return ModelEngine(residency, concurrency=concurrency, context_tokens=context, kv_bytes=0)


def sequences(n: int, prompt_tokens: int, max_tokens: int = 1 << 20, **sampling):
    from engine.batch import Generation
    from engine.sampling import SamplingParams

    return [Generation(prompt_ids=[(7 * i + j) % 500 + 1 for j in range(prompt_tokens)],
                       params=SamplingParams(max_tokens=max_tokens, **sampling), eos_ids=frozenset(),
                       decode=lambda ids: "") for i in range(n)]


def decoding(engine, batch):
    """Join `batch` and step until every sequence decodes (prefill done, one decode step run)."""
    for generation in batch:
        engine.join(generation)
    while any(g.prefilling or len(g.output_ids) < 2 for g in batch):
        engine.step()


def ops_per_layer() -> tuple[float, list[str], int]:
    """Operators of one decode step's layers: (per layer, the first layer's operators, views per layer)."""
    counts = {}
    for layers in (2, 4):
        engine = resident_engine(llama(layers), concurrency=4, context=256)
        decoding(engine, sequences(4, 8, temperature=0))
        counts[layers] = counted(lambda: engine.forward.decode_step(*_decode_inputs(engine)))
    short, long = counts[2].ops, counts[4].ops
    per_layer = (len(long) - len(short)) // 2
    common = next(n for n in range(len(short) + 1) if n == len(short) or short[-1 - n] != long[-1 - n])
    before = len(short) - common  # the operators ahead of the first layer (embedding, rotary tables, masks)
    return per_layer, long[before:before + per_layer], (len(counts[4].views) - len(counts[2].views)) // 2


def _decode_inputs(engine):
    """The tokens, positions and KV-length bucket the engine's next decode-only step runs with."""
    import torch

    from engine.forward.decoder import kv_bucket

    seated = engine.seated
    tokens = torch.tensor([g.output_ids[-1] for g in seated])
    positions = torch.tensor([g.cached for g in seated])
    return tokens, positions, kv_bucket(engine.forward.context, max(g.cached for g in seated) + 1)


def syncs_per_step(steps: int = 8) -> float:
    engine = resident_engine(llama(2), concurrency=4, context=256)
    decoding(engine, sequences(4, 8, temperature=1.0, top_p=0.9, frequency_penalty=0.5, presence_penalty=0.3,
                               repetition_penalty=1.1, seed=3))
    count = counted(lambda: [engine.step() for _ in range(steps)])
    return count.syncs / steps


def kv_read_vs_held() -> tuple[int, int]:
    engine = resident_engine(llama(2), concurrency=1, context=CONTEXT)
    decoding(engine, sequences(1, HELD - 1, temperature=0))
    forward = engine.forward
    held_tokens = engine.seated[0].cached
    per_token = 2 * len(forward.layers) * forward.kv_heads * forward.head_dim * 4
    count = counted(engine.step)
    return count.kv_read, held_tokens * per_token


def http_ratio(requests: int, tokens: int, threads: int | None
               ) -> tuple[tuple[float, float], tuple[float, float], int]:
    """Tokens/s of one request alone and aggregate tokens/s of `requests` at once, through python -m worker and
    through the engine alone on the same tiny llama: ((HTTP alone, HTTP together), (engine alone, together),
    the worker's intra-op threads as its /status reports them). `threads` None: the worker's default.

    The HTTP clients share one connection pool, made before the clock starts: a client built per request
    (an SSL context each, about 20 ms of CPU) would make the bench's own client the bottleneck."""
    import httpx

    sys.path.insert(0, str(ROOT / "tests"))
    from tinymodels import save_tiny_model
    from worker_support import WorkerProcess, config_document, model_entry

    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny_model(Path(tmp) / "llama", "llama")
        engine = _engine_rates(model, requests, tokens)
        document = config_document([model_entry("m", model, "resident", budget=512 << 20, concurrency=requests)])
        limits = httpx.Limits(max_connections=requests, max_keepalive_connections=requests)
        args = () if threads is None else ("--intra-op-threads", str(threads))
        with WorkerProcess(Path(tmp), document, args=args, env={"OMP_NUM_THREADS": None}) as worker, \
                httpx.Client(base_url=worker.base_url, limits=limits, timeout=300) as client:
            worker_threads = client.get("/status").json()["intraOpThreads"]

            def complete(out: list) -> None:
                body = {"model": "m", "prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0}
                out.append(client.post("/v1/completions", json=body).json()["usage"]["completion_tokens"])

            def rate(n: int) -> float:
                done: list[int] = []
                clients = [threading.Thread(target=complete, args=(done,)) for _ in range(n)]
                started = time.perf_counter()
                for thread in clients:
                    thread.start()
                for thread in clients:
                    thread.join()
                return sum(done) / (time.perf_counter() - started)

            rate(requests)  # warm-up, and opens the pool's connections
            alone = max(rate(1) for _ in range(3))
            together = max(rate(requests) for _ in range(3))
            return (alone, together), engine, worker_threads


def _engine_rates(model_dir: Path, requests: int, tokens: int) -> tuple[float, float]:
    """(tokens/s of one greedy sequence, aggregate tokens/s of `requests`) stepping the engine directly."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    engine = resident_engine(model, concurrency=requests, context=256)

    def rate(n: int) -> float:
        batch = sequences(n, 16, max_tokens=tokens, temperature=0)
        for generation in batch:
            engine.join(generation)
        started = time.perf_counter()
        while engine.seated:
            engine.step()
        return sum(len(g.output_ids) for g in batch) / (time.perf_counter() - started)

    rate(requests)  # warm-up
    return max(rate(1) for _ in range(3)), max(rate(requests) for _ in range(3))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-http", action="store_true", help="only the counted figures")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48, help="completion tokens per request")
    parser.add_argument("--threads", type=int, default=None,
                        help="pass --intra-op-threads N to the worker (default: none, the worker's own choice)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    print(f"machine: {platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}; "
          f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    per_layer, one_layer, views = ops_per_layer()
    syncs = syncs_per_step()
    read, held = kv_read_vs_held()
    missed = []
    print(f"operators per decoder layer per decode step: {per_layer} (target <= 16; plus {views} views)")
    print("  " + ", ".join(op.replace(".default", "") for op in one_layer))
    print(f"host syncs per decode step (temperature 1, top-p, penalties): {syncs:g} (target <= 1)")
    print(f"KV bytes read per decode step at {CONTEXT} context holding {HELD} tokens: {read} vs {held} held "
          f"= {read / held:.2f}x (target <= 2x)")
    missed += [name for name, bad in (("operators", per_layer > 16), ("syncs", syncs > 1),
                                      ("kv-read", read > 2 * held)) if bad]
    if not args.skip_http:
        (alone, together), (engine_alone, engine_together), threads = http_ratio(args.requests, args.tokens,
                                                                                 args.threads)
        ratio = together / alone
        how = "default settings" if args.threads is None else f"--intra-op-threads {args.threads}"
        print(f"python -m worker ({how}: {threads} intra-op thread(s)), CPU, tiny llama: {args.requests} concurrent "
              f"greedy requests {together:.1f} tokens/s vs 1 alone {alone:.1f} tokens/s = {ratio:.2f}x (target >= 4x)")
        print(f"  the engine alone, same model and thread: {args.requests} sequences {engine_together:.1f} tokens/s "
              f"vs 1 {engine_alone:.1f} tokens/s = {engine_together / engine_alone:.2f}x")
        missed += ["http"] if ratio < 4 else []
    print(json.dumps({"missed": missed}))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
