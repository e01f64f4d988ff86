"""GPU benchmark of the worker's engine: roofline, batching, co-tenancy and predictions, in one table.

Run on a CUDA machine:  python bench/worker_gpu.py [--shape llama-8b] [--elastic-budget-gib 8]
Without CUDA it exits with a message (status 2). `--cpu-smoke` runs the same code on CPU with a
tiny shape, to check the script end to end: its numbers are CPU numbers, judged against nothing.
Exit status 1 when a target is missed on a GPU.

Every request goes through the worker's executor (worker.scheduler) as the API submits it, on
models placed by the worker's residency modes. The model is a random-weight model of a published
shape (no weights are downloaded). One table:
- the measured HBM bandwidth (device-to-device copy, read + write) and the decode roofline
  (weight bytes / HBM bandwidth);
- resident ms/token at C=1 against the roofline (target <= 1.3x);
- aggregate tokens/s at C=1, 8 and 32, resident and elastic (C=8 >= 6x C=1 for both), and the
  elastic step at C=8 against the PCIe floor (streamed bytes / pinned bandwidth; target <= 1.2x);
- a resident model's TPOT p99 while an elastic neighbour decodes, against its solo TPOT (<= 1.5x);
- the swap-in time against model bytes / pinned bandwidth (<= 1.2x);
- the TPOT the planner predicts (controller.planning.cost.predict_resident) from a profile that the profiler
  measured through the same engine, against the measured TPOT at C=1 and C=8 (within +-15 %).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
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
CONCURRENCIES = (1, 8, 32)
PREDICTED_AT = (1, 8)
WAIT_S = 1800  # a run that has not finished by then is reported as stuck


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b")
    parser.add_argument("--elastic-budget-gib", type=float, default=8.0,
                        help="the elastic model's budget (decides its resident layers)")
    parser.add_argument("--decode-tokens", type=int, default=32, help="tokens per resident request")
    parser.add_argument("--elastic-decode-tokens", type=int, default=24, help="tokens per elastic request")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="tokens in each request's prompt")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shape on CPU: checks the script only")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="every request's temperature (above 0: top-p 0.95 and a seed, sampled on the device)")
    parser.add_argument("--resident-only", action="store_true",
                        help="only the resident rows (HBM, roofline, C=1 ms/token, C=1 and C=8 aggregate): one cell "
                             "of the temperature x context matrix bench/gpu_run.sh runs")
    args = parser.parse_args(argv)

    import torch

    if args.cpu_smoke:
        args.shape, args.decode_tokens, args.elastic_decode_tokens, args.prompt_tokens = "tiny", 8, 8, 16
        torch.set_num_threads(1)  # tiny models run far slower with intra-op threads on a shared CPU
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("bench/worker_gpu.py needs a CUDA device (torch sees none); run it on a GPU node, "
              "or pass --cpu-smoke to check the script on CPU", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", 0)
    torch.manual_seed(0)
    bench = Bench(args, device)
    try:
        rows = bench.run()
    finally:
        bench.stop()
    print_table(rows, bench)
    return 0 if args.cpu_smoke or all(row.verdict != "MISS" for row in rows) else 1


@dataclass
class Trace:
    """One request's token times (perf_counter seconds) as its sink received them."""

    model: str
    times: list[float] = field(default_factory=list)
    error: object = None
    job: object = None
    finished: threading.Event = field(default_factory=threading.Event)

    def sink(self, event) -> None:
        from worker.events import ErrorEvent, FinishEvent, TokenEvent

        if isinstance(event, TokenEvent):
            self.times.append(time.perf_counter())
        elif isinstance(event, ErrorEvent):
            self.error = event.error
            self.finished.set()
        elif isinstance(event, FinishEvent):
            self.finished.set()

    def intervals_ms(self, until: float = float("inf")) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.times, self.times[1:]) if b <= until]


@dataclass(frozen=True)
class Row:
    measure: str
    value: float
    unit: str
    reference: str = ""
    ratio: float | None = None
    target: str = ""
    verdict: str = ""


class Bench:
    def __init__(self, args, device):
        import torch
        from transformers import LlamaConfig

        from worker.metrics import WorkerMetrics
        from worker.scheduler import Scheduler

        self.args, self.device = args, device
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.config = LlamaConfig(**SHAPES[args.shape], tie_word_embeddings=False, dtype=str(self.dtype)[6:])
        self.host_state = self._random_host_state()
        self.hbm_bps = hbm_bandwidth(device)
        self.pinned_bps = pinned_bandwidth(device)
        self.scheduler = Scheduler(min_residency_s=0.0, max_queued=4 * max(CONCURRENCIES),
                                   metrics=WorkerMetrics())
        self.scheduler.start()
        self.residencies: dict = {}
        self._seed = 0

    # models
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

    def weight_bytes(self, layers: set[int] | None = None) -> int:
        """All weight bytes, or only those of the decoder layers in `layers`."""
        return sum(t.numel() * t.element_size() for name, t in self.host_state.items()
                   if layers is None or _layer_of(name) in layers)

    def add(self, name: str, mode: str, *, budget: int = 1 << 50, resident_layers: int | None = None):
        """A model in `mode`, served by its own ModelEngine (KV slots for the largest concurrency) in the
        executor; the resident one has the priority a model with a latency SLO gets."""
        from engine.batch import ModelEngine
        from engine.memory import DeviceLedger
        from engine.residency import make_residency

        residency = make_residency(mode, self.skeleton(), DeviceLedger(name, budget, self.device), self.device,
                                   **({} if resident_layers is None else {"resident_layers": resident_layers}))
        residency.load()
        engine = ModelEngine(residency, concurrency=max(CONCURRENCIES), context_tokens=self.context_tokens,
                             kv_bytes=self.kv_bytes_per_token() * self.context_tokens * max(CONCURRENCIES))
        self.scheduler.add_model(name, engine, priority=mode == "resident")
        self.residencies[name] = residency
        return residency

    def kv_bytes_per_token(self) -> int:
        c = self.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * self.dtype.itemsize

    def elastic_budget(self) -> int:
        """--elastic-budget-gib; with --cpu-smoke, what the worker's admission needs for half the layers."""
        if not self.args.cpu_smoke:
            return int(self.args.elastic_budget_gib * (1 << 30))
        from worker.admission import need_for

        return need_for(self.elastic_spec(0), self.shape(), self.config.num_hidden_layers // 2).total

    def elastic_spec(self, budget: int):
        from worker.config import ModelConfig

        return ModelConfig(name="elastic", namespace="bench", model="random", mode="elastic", budget_bytes=budget,
                           context_tokens=self.context_tokens, concurrency=max(CONCURRENCIES))

    def shape(self):
        from worker.shape import shape_from

        tensors = {name: {"dtype": {"bfloat16": "BF16", "float32": "F32"}[str(t.dtype)[6:]], "shape": list(t.shape)}
                   for name, t in self.host_state.items()}
        return shape_from(self.config.to_dict(), tensors)

    def elastic_layers(self, budget: int) -> int:
        """The resident layers the worker's admission gives the elastic budget at the largest concurrency."""
        from worker.admission import admit

        [verdict] = admit([(self.elastic_spec(budget), self.shape())], budget, slot="bench")
        if verdict.verdict != "applied":
            raise SystemExit(f"the elastic budget is too small for this shape: {verdict.message}")
        if verdict.resident_layers == self.config.num_hidden_layers:
            raise SystemExit("the elastic budget holds the whole model: nothing streams; lower --elastic-budget-gib")
        return verdict.resident_layers

    @property
    def context_tokens(self) -> int:
        return self.args.prompt_tokens + max(self.args.decode_tokens, self.args.elastic_decode_tokens) * 2 + 8

    # requests through the worker's executor
    def submit(self, model: str, tokens: int) -> Trace:
        import torch

        from engine.batch import Generation
        from engine.sampling import SamplingParams

        self._seed += 1
        generator = torch.Generator().manual_seed(self._seed)
        prompt = torch.randint(0, self.config.vocab_size, (self.args.prompt_tokens,), generator=generator).tolist()
        sampled = self.args.temperature > 0
        params = SamplingParams(max_tokens=tokens, temperature=self.args.temperature, top_p=0.95 if sampled else 1.0,
                                seed=self._seed)
        generation = Generation(prompt_ids=prompt, params=params, eos_ids=frozenset(),
                                decode=lambda ids: "x" * len(ids))  # one event per token
        trace = Trace(model)
        trace.job = self.scheduler.submit(model, generation, trace.sink)
        return trace

    def wait(self, traces: list[Trace]) -> list[Trace]:
        for trace in traces:
            if not trace.finished.wait(WAIT_S):
                raise SystemExit(f"a {trace.model} request did not finish within {WAIT_S} s")
            if trace.error is not None:
                raise SystemExit(f"a {trace.model} request failed: {trace.error}")
        return traces

    def concurrent(self, model: str, concurrency: int, tokens: int) -> tuple[float, float]:
        """(aggregate tokens/s, mean TPOT ms) while all `concurrency` requests decode together. A first,
        untimed round at the same concurrency captures the decode graph of that batch bucket."""
        self.wait([self.submit(model, tokens) for _ in range(concurrency)])
        traces = self.wait([self.submit(model, tokens) for _ in range(concurrency)])
        start = max(t.times[0] for t in traces)   # every request has its first token: the batch is full
        end = min(t.times[-1] for t in traces)    # until the first one finishes
        emitted = sum(1 for t in traces for at in t.times if start < at <= end)
        if end <= start or emitted == 0:
            raise SystemExit(f"{model} at C={concurrency}: no window where all requests decode together; "
                             "raise --decode-tokens")
        tokens_per_s = emitted / (end - start)
        return tokens_per_s, concurrency / tokens_per_s * 1000

    # phases
    def run(self) -> list[Row]:
        self.add("resident", "resident")
        self.wait([self.submit("resident", 2)])  # warm-up: kernels, allocator
        concurrencies = (1, 8) if self.args.resident_only else CONCURRENCIES
        resident = {c: self.concurrent("resident", c, self.args.decode_tokens) for c in concurrencies}
        if self.args.resident_only:
            return self.resident_rows(resident, concurrencies)
        self.budget = self.elastic_budget()
        self.elastic_resident_layers = self.elastic_layers(self.budget)
        elastic = self.add("elastic", "elastic", budget=self.budget, resident_layers=self.elastic_resident_layers)
        self.wait([self.submit("elastic", 2)])
        elastic_agg = {c: self.concurrent("elastic", c, self.args.elastic_decode_tokens) for c in CONCURRENCIES}
        streamed = set(range(self.config.num_hidden_layers)) - set(elastic.device_resident_layers())
        floor_ms = self.weight_bytes(streamed) / self.pinned_bps * 1000
        cotenant_p99 = self.cotenant_p99()
        swap_s = self.swap_in()
        profile = self.profile()
        predicted = {c: self.predicted_tpot(profile, c) for c in PREDICTED_AT}

        solo_ms = resident[1][1]
        swap_floor_s = self.weight_bytes() / self.pinned_bps
        judge = self.judge
        rows = self.resident_rows(resident, ())
        for name, agg in (("resident", resident), ("elastic", elastic_agg)):
            base = agg[1][0]
            for c in CONCURRENCIES:
                ratio, target = (None, "") if c == 1 else (agg[c][0] / base, ">= 6.0" if c == 8 else "(info)")
                rows.append(Row(f"{name} aggregate tokens/s, C={c}", agg[c][0], "tok/s",
                                "" if c == 1 else "C=1", ratio, target,
                                judge(ratio >= 6.0) if c == 8 else ""))
        step_ms = elastic_agg[8][1]
        rows += [
            Row("elastic step ms, C=8", step_ms, "ms", "PCIe floor", step_ms / floor_ms, "<= 1.2",
                judge(step_ms / floor_ms <= 1.2)),
            Row("resident TPOT p99 beside elastic decode", cotenant_p99, "ms", "solo TPOT", cotenant_p99 / solo_ms,
                "<= 1.5", judge(cotenant_p99 / solo_ms <= 1.5)),
            Row("swap-in (warm allocator)", swap_s, "s", "bytes / pinned", swap_s / swap_floor_s, "<= 1.2",
                judge(swap_s / swap_floor_s <= 1.2)),
        ]
        for c in PREDICTED_AT:
            measured = resident[c][1]
            ratio = predicted[c] / measured
            rows.append(Row(f"predicted TPOT, C={c}", predicted[c], "ms", "measured TPOT", ratio, "0.85..1.15",
                            judge(0.85 <= ratio <= 1.15)))
        self.floor_ms, self.profile_steps = floor_ms, profile["latency"].get("decodeStepMs", [])
        return rows

    def judge(self, ok: bool) -> str:
        return "-" if self.args.cpu_smoke else ("ok" if ok else "MISS")

    def resident_rows(self, resident: dict, concurrencies) -> list[Row]:
        """HBM, roofline, C=1 ms/token against it, and the resident aggregate at `concurrencies` (C=8: >= 6x)."""
        roofline_ms = self.weight_bytes() / self.hbm_bps * 1000
        solo_ms = resident[1][1]
        rows = [
            Row("HBM bandwidth (device copy, read + write)", self.hbm_bps / 1e9, "GB/s"),
            Row("decode roofline (weight bytes / HBM)", roofline_ms, "ms/token"),
            Row("resident ms/token, C=1", solo_ms, "ms", "roofline", solo_ms / roofline_ms, "<= 1.3",
                self.judge(solo_ms / roofline_ms <= 1.3)),
        ]
        for c in concurrencies:
            ratio = None if c == 1 else resident[c][0] / resident[1][0]
            rows.append(Row(f"resident aggregate tokens/s, C={c}", resident[c][0], "tok/s", "" if c == 1 else "C=1",
                            ratio, "" if c == 1 else ">= 6.0", "" if c == 1 else self.judge(ratio >= 6.0)))
        return rows

    def cotenant_p99(self) -> float:
        """p99 of the resident model's inter-token times while an elastic request decodes beside it."""
        elastic = self.submit("elastic", 4 * self.args.decode_tokens)
        while not elastic.times and not elastic.finished.is_set():
            time.sleep(0.001)  # the elastic request is decoding before the resident one starts
        resident = self.wait([self.submit("resident", self.args.decode_tokens)])[0]
        elastic_until = elastic.times[-1]
        elastic.job.cancelled = True  # frees its slot at the elastic model's next step boundary
        while not self.scheduler.idle():
            time.sleep(0.01)
        beside = resident.intervals_ms(until=elastic_until)
        if len(beside) < 2:
            raise SystemExit("the elastic neighbour finished before the resident request decoded; "
                             "raise --decode-tokens")
        return percentile(beside, 99)

    def swap_in(self) -> float:
        """Median of 3 warm swap-ins of the whole model (a fourth, cold one first)."""
        from engine.memory import DeviceLedger
        from engine.residency import make_residency

        residency = make_residency("swap", self.skeleton(), DeviceLedger("swap", 1 << 50, self.device), self.device)
        residency.load()
        times = []
        for _ in range(4):
            synchronize(self.device)
            started = time.perf_counter()
            residency.activate()
            synchronize(self.device)
            times.append(time.perf_counter() - started)
            residency.deactivate()
        return statistics.median(times[1:])

    def profile(self) -> dict:
        """The resident model profiled by the profiler Job's code through the worker's engine, at C=8."""
        import io

        from profiler_job.args import Options
        from profiler_job.gpu import current_identity
        from profiler_job.measure.device import Device
        from profiler_job.measure.estimated import cpu_identity
        from profiler_job.progress import Progress
        from profiler_job.run import measure_model

        device = Device(self.device.type)
        identity = cpu_identity("NVIDIA-H200") if self.args.cpu_smoke else current_identity(None)
        options = Options(model=f"random {self.args.shape}", dtype=str(self.dtype)[6:],
                          context_tokens=self.context_tokens, concurrency=max(PREDICTED_AT), repeats=5)
        return measure_model(self.residencies["resident"].model, options, device, identity,
                             Progress(io.StringIO(), tty=False))

    def predicted_tpot(self, doc: dict, concurrency: int) -> float:
        from controller.inputs.load import parse_profile
        from controller.planning.cost import predict_resident
        from controller.types import SLO

        profile, errors = parse_profile(doc, "bench")
        if profile is None:
            raise SystemExit(f"the profile does not load: {errors}")
        return predict_resident(profile, SLO(context_tokens=self.context_tokens, concurrency=concurrency)).tpot_ms

    def stop(self) -> None:
        self.scheduler.stop()


def _layer_of(name: str) -> int | None:
    prefix = "model.layers."
    return int(name[len(prefix):].split(".", 1)[0]) if name.startswith(prefix) else None


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def hbm_bandwidth(device) -> float:
    """Device memory bytes/s: a device-to-device copy reads and writes each byte (median of 5)."""
    import torch

    size = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * size / _median_s(lambda: dst.copy_(src), device)


def pinned_bandwidth(device) -> float:
    """Host->device bytes/s from a pinned buffer (median of 5)."""
    import torch

    size = (1 << 30) if device.type == "cuda" else (64 << 20)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    return size / _median_s(lambda: dev.copy_(host, non_blocking=True), device)


def _median_s(copy, device) -> float:
    times = []
    for _ in range(6):
        synchronize(device)
        started = time.perf_counter()
        copy()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def print_table(rows: list[Row], bench: Bench) -> None:
    import torch
    import transformers

    device = bench.device
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else "CPU (smoke run: CPU numbers, no target is judged)")
    print(f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"shape: {bench.args.shape} ({bench.weight_bytes() / 1e6:,.1f} MB, {str(bench.dtype)[6:]}); prompt "
          f"{bench.args.prompt_tokens} tokens; {bench.args.decode_tokens} tokens per resident request, "
          f"{bench.args.elastic_decode_tokens} per elastic request; temperature {bench.args.temperature:g}")
    if not bench.args.resident_only:
        print_elastic_header(bench)
    print(f"{'measure':<42} | {'value':>10} | {'unit':<8} | {'against':<14} | {'ratio':>6} | {'target':>10} |")
    for row in rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}"
        print(f"{row.measure:<42} | {row.value:>10.3f} | {row.unit:<8} | {row.reference:<14} | {ratio:>6} | "
              f"{row.target:>10} | {row.verdict}")


def print_elastic_header(bench: Bench) -> None:
    layers = bench.config.num_hidden_layers
    print(f"pinned host->device {bench.pinned_bps / 1e9:.1f} GB/s; elastic budget {bench.budget / (1 << 30):.3f} GiB "
          f"-> {bench.elastic_resident_layers}/{layers} resident layers, PCIe floor {bench.floor_ms:.3f} ms/step")
    steps = ", ".join(f"{s['batch']}: {s['ms']:.3f}" for s in bench.profile_steps)
    print(f"profile (profiler through the worker's engine) decodeStepMs by batch: {steps}")


if __name__ == "__main__":
    sys.exit(main())
