"""GPU benchmark of the worker's residency modes, on a random model of a realistic shape.

Run on a CUDA machine:  python bench/worker_gpu.py [--shape llama-8b] [--budget-gib 8]
Without CUDA it exits with a message (status 2); `--cpu-smoke` runs the same code on a tiny
shape on CPU only to check the script end to end (its numbers mean nothing).

Prints one table with measured numbers, ratios and targets:
- elastic decode ms/token vs the PCIe floor (streamed bytes per token / measured pinned
  host->device bandwidth): target <= 1.2x; and vs accelerate CPU offload with the same layers
  on the GPU: target >= 3x faster;
- swap-in seconds vs model bytes / bandwidth: target <= 1.2x;
- resident decode (worker engine) vs plain transformers generate: target within 5 %.
No weights are downloaded: the model is built from a config and filled with random values.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    # Llama-3.1-8B's published architecture (bf16: ~16 GB of weights).
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192),
    # For --cpu-smoke only.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=512),
}
PROMPT_TOKENS = 128


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b")
    parser.add_argument("--budget-gib", type=float, default=8.0, help="elastic budget (decides resident layers)")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shape on CPU: checks the script only")
    args = parser.parse_args()

    import torch

    if args.cpu_smoke:
        args.shape, args.budget_gib, args.decode_tokens = "tiny", 0.0015, 4
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("bench/worker_gpu.py needs a CUDA device (torch sees none); run it on a GPU node, "
              "or pass --cpu-smoke to check the script on CPU", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", 0)
    torch.manual_seed(0)
    bench = Bench(args, device)
    rows = bench.run()
    print_table(rows, device, bench)
    return 0 if args.cpu_smoke or all(r[-1] != "MISS" for r in rows) else 1


class Bench:
    def __init__(self, args, device):
        import torch
        from transformers import LlamaConfig

        self.args = args
        self.device = device
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.config = LlamaConfig(**SHAPES[args.shape], tie_word_embeddings=False, dtype=str(self.dtype)[6:])
        self.host_state = self._random_host_state()
        self.bandwidth = pinned_bandwidth(device)
        self.prompt = torch.randint(0, self.config.vocab_size, (PROMPT_TOKENS,)).tolist()

    # model building
    def skeleton(self):
        """A model whose parameters are the shared host tensors (no copy); buffers built on CPU."""
        from accelerate import init_empty_weights
        from transformers import AutoModelForCausalLM

        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(self.config, dtype=self.dtype)
        model.load_state_dict(self.host_state, assign=True, strict=True)
        return model.eval()

    def _random_host_state(self) -> dict:
        import torch
        from accelerate import init_empty_weights
        from transformers import AutoModelForCausalLM

        with init_empty_weights(include_buffers=False):
            meta = AutoModelForCausalLM.from_config(self.config, dtype=self.dtype)
        state = {}
        for name, param in meta.state_dict().items():
            t = torch.empty(param.shape, dtype=self.dtype, device=self.device)
            t.fill_(1.0) if name.endswith("norm.weight") else t.normal_(0.0, 0.02)
            state[name] = t.cpu()
        return state

    def model_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host_state.values())

    # phases
    def run(self) -> list[tuple]:
        # Each phase builds its own model from the shared host tensors; its device memory goes when it returns.
        resident_ms, plain_ms = self.resident_vs_generate()
        release(self.device)
        swap_s, swap_cold_s = self.swap_in()
        release(self.device)
        layers, elastic_ms, streamed_per_token = self.elastic()
        release(self.device)
        offload_ms = self.accelerate_offload(layers)
        release(self.device)
        floor_ms = streamed_per_token / self.bandwidth * 1000
        swap_floor_s = self.model_bytes() / self.bandwidth
        self.resident_layers = layers
        return [
            ("elastic decode ms/token", elastic_ms, "PCIe floor", floor_ms, elastic_ms / floor_ms, "<= 1.2",
             verdict(elastic_ms / floor_ms <= 1.2)),
            ("elastic decode ms/token", elastic_ms, "accelerate offload", offload_ms, offload_ms / elastic_ms,
             ">= 3.0 (speed-up)", verdict(offload_ms / elastic_ms >= 3.0)),
            ("swap-in s (warm allocator)", swap_s, "bytes / bandwidth", swap_floor_s, swap_s / swap_floor_s,
             "<= 1.2", verdict(swap_s / swap_floor_s <= 1.2)),
            ("swap-in s (first, cold)", swap_cold_s, "bytes / bandwidth", swap_floor_s, swap_cold_s / swap_floor_s,
             "(info)", ""),
            ("resident decode ms/token", resident_ms, "transformers generate", plain_ms, resident_ms / plain_ms,
             "<= 1.05", verdict(resident_ms / plain_ms <= 1.05)),
        ]

    def resident_vs_generate(self) -> tuple[float, float]:
        import torch

        from worker.memory import DeviceLedger
        from worker.residency import make_residency

        model = self.skeleton()
        residency = make_residency("resident", model, DeviceLedger("bench", 1 << 50, self.device), self.device)
        residency.load()
        n = self.args.decode_tokens
        ids = torch.tensor([self.prompt], device=self.device)

        def plain(tokens: int) -> float:
            with torch.inference_mode():
                started = time.perf_counter()
                model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
                synchronize(self.device)
                return time.perf_counter() - started

        engine = new_engine(residency, len(self.prompt) + 2 * n + 8)

        def ours(tokens: int) -> float:
            started = time.perf_counter()
            run_alone(engine, new_generation(self.prompt, tokens))
            synchronize(self.device)
            return time.perf_counter() - started

        plain(2), ours(2)  # warm-up: kernels, allocator
        plain_ms = per_token_ms(plain, n)
        ours_ms = per_token_ms(ours, n)
        return ours_ms, plain_ms

    def swap_in(self) -> tuple[float, float]:
        from worker.memory import DeviceLedger
        from worker.residency import make_residency

        residency = make_residency("swap", self.skeleton(), DeviceLedger("bench", 1 << 50, self.device), self.device)
        residency.load()
        times = []
        for _ in range(4):
            started = time.perf_counter()
            residency.activate()
            times.append(time.perf_counter() - started)
            residency.deactivate()
        return statistics.median(times[1:]), times[0]

    def elastic(self) -> tuple[int, float, float]:
        from worker.admission import admit
        from worker.config import ModelConfig
        from worker.memory import DeviceLedger
        from worker.residency import make_residency
        from worker.shape import shape_from

        tensors = {name: {"dtype": {"bfloat16": "BF16", "float32": "F32"}[str(t.dtype)[6:]], "shape": list(t.shape)}
                   for name, t in self.host_state.items()}
        shape = shape_from(self.config.to_dict(), tensors)
        budget = int(self.args.budget_gib * (1 << 30))
        spec = ModelConfig(name="bench", namespace="bench", model="random", mode="elastic", budget_bytes=budget,
                           context_tokens=PROMPT_TOKENS + self.args.decode_tokens + 8, concurrency=1)
        [applied] = admit([(spec, shape)], budget, slot="bench")
        if applied.verdict != "applied":
            raise SystemExit(f"elastic budget too small for this shape: {applied.message}")
        layers = applied.resident_layers
        if layers == self.config.num_hidden_layers:
            raise SystemExit("the elastic budget holds the whole model: nothing streams; lower --budget-gib")
        residency = make_residency("elastic", self.skeleton(), DeviceLedger("bench", budget, self.device),
                                   self.device, resident_layers=layers)
        residency.load()
        streamed = []
        residency.on_streamed_bytes = streamed.append
        generation = new_generation(self.prompt, self.args.decode_tokens + 1)
        engine = new_engine(residency, PROMPT_TOKENS + self.args.decode_tokens + 8)
        engine.join(generation)
        engine.step()  # prefill + first token
        streamed.clear()
        synchronize(self.device)
        started = time.perf_counter()
        while not generation.done:
            engine.step()
        synchronize(self.device)
        elapsed_ms = (time.perf_counter() - started) * 1000
        tokens = self.args.decode_tokens
        self.elastic_peak_bytes = residency.ledger.peak_bytes
        return layers, elapsed_ms / tokens, sum(streamed) / tokens

    def accelerate_offload(self, resident_layers: int) -> float:
        import torch
        from accelerate import dispatch_model

        model = self.skeleton()
        gpu = 0 if self.device.type == "cuda" else "cpu"
        device_map = {"model.embed_tokens": gpu, "model.norm": gpu, "model.rotary_emb": gpu, "lm_head": gpu}
        for i in range(self.config.num_hidden_layers):
            device_map[f"model.layers.{i}"] = gpu if i < resident_layers else "cpu"
        if self.device.type == "cuda":
            model = dispatch_model(model, device_map=device_map, main_device=0)
        ids = torch.tensor([self.prompt[:32]], device=self.device)

        def run(tokens: int) -> float:
            with torch.inference_mode():
                started = time.perf_counter()
                model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
                synchronize(self.device)
                return time.perf_counter() - started

        run(1)
        ms = per_token_ms(run, 4, repeats=2)
        return ms


def new_generation(prompt: list[int], tokens: int):
    from worker.engine import Generation
    from worker.sampling import SamplingParams

    return Generation(prompt_ids=list(prompt), params=SamplingParams(max_tokens=tokens, temperature=0),
                      eos_ids=frozenset(), decode=lambda ids: "")


def new_engine(residency, context_tokens: int):
    """The worker's engine over `residency`, one sequence slot."""
    from worker.engine import ModelEngine

    return ModelEngine(residency, concurrency=1, context_tokens=context_tokens, kv_bytes=0)


def run_alone(engine, generation) -> None:
    engine.join(generation)
    while not generation.done:
        engine.step()


def per_token_ms(run, tokens: int, repeats: int = 3) -> float:
    """Decode ms/token: (best time for 1 + n tokens - best time for 1 token) / n, so prefill cancels out."""
    return (min(run(1 + tokens) for _ in range(repeats)) - min(run(1) for _ in range(repeats))) / tokens * 1000


def pinned_bandwidth(device) -> float:
    """Measured host->device bytes/s for a 1 GiB pinned buffer (median of 5)."""
    import torch

    size = (1 << 30) if device.type == "cuda" else (64 << 20)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    times = []
    for _ in range(6):
        synchronize(device)
        started = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        synchronize(device)
        times.append(time.perf_counter() - started)
    return size / statistics.median(times[1:])


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def print_table(rows, device, bench) -> None:
    import torch

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke run: numbers mean nothing)"
    print(f"device: {name}; shape: {bench.args.shape} ({bench.model_bytes() / 1e9:.2f} GB, {bench.dtype}); "
          f"pinned host->device: {bench.bandwidth / 1e9:.1f} GB/s; elastic budget {bench.args.budget_gib} GiB -> "
          f"{bench.resident_layers}/{bench.config.num_hidden_layers} resident layers, "
          f"peak device bytes {bench.elastic_peak_bytes / 1e9:.2f} GB")
    header = ("measure", "value", "against", "reference", "ratio", "target", "")
    print(" | ".join(f"{h:<26}" if i in (0, 2) else f"{h:>10}" for i, h in enumerate(header)))
    for measure, value, against, reference, ratio, target, result in rows:
        print(f"{measure:<26} | {value:>10.3f} | {against:<26} | {reference:>10.3f} | {ratio:>10.2f} | "
              f"{target:>10} | {result}")


if __name__ == "__main__":
    sys.exit(main())
