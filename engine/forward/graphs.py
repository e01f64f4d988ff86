"""CUDA graphs for decode-only steps of the decoder forward, one per (batch bucket, KV-length bucket).

A step where every seated sequence decodes one token (the steady state) replays the graph
captured for the smallest batch bucket (1, 2, 4, ... up to the concurrency) that holds the
batch and the smallest KV-length bucket (decoder.kv_buckets: powers of two up to the
context) that holds its longest sequence, so the KV bytes a step reads track the tokens held,
not the configured context. Other steps (a prefill chunk in the batch) and pairs that could
not be captured run eagerly through the same DecoderForward.

Every pair is captured by `allocate`, at load and at each swap-in, before the model serves
(a pair missing later, e.g. after a failed capture, is retried at first use). A capture runs on
a side stream of the model's in thread-local capture mode and synchronizes that stream only:
no device-wide synchronization and no emptying of the allocator's cache, so the other models
keep serving (captures themselves take turns). The model's graphs share one memory pool. The
pool counts against the model's budget: the footprint's overhead reservation holds graph pools
(contract/footprint.py), and a pool beyond it is charged on top ("cuda-graphs"); a capture that
would pass the budget is dropped and that pair stays eager. Weights move on a swap-in, so
`release` (swap-out) drops the graphs with the KV slots. Constructed on CUDA by
engine/forward/__init__.py; `eager_capture` keeps the same contract without a graph, so the CPU
tests run this module and the shape-static step it replays. Called by engine/batch.py.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from contract.batching import buckets

from ..errors import BudgetExceeded
from ..transfer import upload
from .decoder import DecoderForward, kv_bucket, kv_buckets
from .rows import Row

log = logging.getLogger(__name__)
WARMUP_STEPS = 3
# one capture at a time in the process: the captures of several models never interleave in the allocator
_capture_lock = threading.Lock()


@dataclass
class Captured:
    """One pair's replayable decode step: fill `tokens` and `positions`, call `replay`, read `logits`."""

    replay: Callable[[], None]
    tokens: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor
    pool_bytes: int  # graph memory pool held after this capture
    pool: object = None  # the CUDA graph memory pool (shared by the model's graphs)
    graph: object = None  # the CUDA graph, kept alive with its replay


Capture = Callable[[DecoderForward, int, int, "Captured | None"], Captured]


def cuda_capture(inner: DecoderForward, bucket: int, length: int, previous: Captured | None) -> Captured:
    """Capture `inner.decode_step` for `bucket` rows over `length` keys as a CUDA graph (warm-up first, on a
    side stream), in the memory pool the model's earlier captures use. Only the side stream is synchronized."""
    device = inner.device
    tokens, positions = _static_inputs(inner, bucket, length)
    pool = previous.pool if previous is not None else torch.cuda.graph_pool_handle()
    with _capture_lock:
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                inner.decode_step(tokens, positions, length)
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                logits = inner.decode_step(tokens, positions, length)
            finally:
                graph.capture_end()
        side.synchronize()
    return Captured(graph.replay, tokens, positions, logits, _pool_bytes(pool), pool=pool, graph=graph)


def eager_capture(inner: DecoderForward, bucket: int, length: int, previous: Captured | None) -> Captured:
    """The same static-buffer contract without a graph: `replay` runs `decode_step` eagerly. Lets the CPU
    tests drive GraphedDecoder and the shape-static decode step it replays."""
    tokens, positions = _static_inputs(inner, bucket, length)
    logits = torch.empty(bucket, inner.head.out_features, dtype=torch.float32, device=inner.device)
    return Captured(lambda: logits.copy_(inner.decode_step(tokens, positions, length)), tokens, positions, logits, 0)


def _static_inputs(inner: DecoderForward, bucket: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Padding rows decode at the context's last position, which no step attends to before a sequence
    writes it itself (they attend over the bucket's keys, all of them)."""
    tokens = torch.zeros(bucket, dtype=torch.long, device=inner.device)
    positions = torch.full((bucket,), inner.context - 1, dtype=torch.long, device=inner.device)
    return tokens, positions


class GraphedDecoder:
    path = "decoder"
    fallback = None

    def __init__(self, inner: DecoderForward, capture: Capture = cuda_capture):
        self.inner = inner
        self.capture = capture
        self.pairs = [(b, n) for b in buckets(inner.slots) for n in kv_buckets(inner.context)]
        self.graphs: dict[tuple[int, int], Captured] = {}
        self.eager: set[tuple[int, int]] = set()

    @property
    def graph_bytes(self) -> int:
        return max((c.pool_bytes for c in self.graphs.values()), default=0)

    @torch.inference_mode()
    def allocate(self) -> None:
        """The KV slots, then every graph: the model serves only once its decode steps are captured."""
        self.inner.allocate()
        for pair in self.pairs:
            if pair not in self.graphs:
                self._capture(*pair)

    def release(self) -> None:
        self.graphs.clear()
        self.eager.clear()
        self.inner.residency.ledger.reserve("cuda-graphs", 0)
        self.inner.release()

    def free(self, slot: int) -> None:
        self.inner.free(slot)

    def move(self, src: int, dst: int, length: int) -> None:
        self.inner.move(src, dst, length)

    @torch.inference_mode()
    def run(self, rows: list[Row]) -> torch.Tensor:
        size = len(rows)
        if any(len(r.tokens) != 1 for r in rows) or [r.slot for r in rows] != list(range(size)):
            return self.inner.run(rows)
        bucket = next(b for b in buckets(self.inner.slots) if b >= size)
        length = kv_bucket(self.inner.context, max(r.start for r in rows) + 1)
        captured = self.graphs.get((bucket, length)) or self._capture(bucket, length)
        if captured is None:
            return self.inner.run(rows)
        padding = [0] * (bucket - size), [self.inner.context - 1] * (bucket - size)
        device = self.inner.device
        captured.tokens.copy_(upload([r.tokens[0] for r in rows] + padding[0], torch.long, device))
        captured.positions.copy_(upload([r.start for r in rows] + padding[1], torch.long, device))
        captured.replay()
        return captured.logits[:size]

    def _capture(self, bucket: int, length: int) -> Captured | None:
        if (bucket, length) in self.eager:
            return None
        ledger = self.inner.residency.ledger
        previous = next(iter(self.graphs.values()), None)
        try:
            captured = self.capture(self.inner, bucket, length, previous)
        except Exception:  # an op that cannot be captured: this model decodes eagerly
            log.exception("%s: CUDA graph capture failed for batch %d over %d keys; decoding eagerly", ledger.model,
                          bucket, length)
            self.eager.update(self.pairs)
            return None
        try:  # the footprint's overhead holds the graph pools; only a pool beyond it is charged on top
            ledger.reserve("cuda-graphs", max(0, captured.pool_bytes - ledger.reserved("overhead")))
        except BudgetExceeded as exc:
            log.warning("%s: graphs for batch %d over %d keys would pass the budget (%s); that step decodes "
                        "eagerly", ledger.model, bucket, length, exc.message)
            self.eager.add((bucket, length))
            return None
        self.graphs[(bucket, length)] = captured
        log.info("%s: captured the decode step for batch %d over %d keys (graph pool %d bytes)", ledger.model,
                 bucket, length, captured.pool_bytes)
        return captured


def _pool_bytes(pool) -> int:
    """Bytes of the allocator segments that belong to graph memory pool `pool`."""
    return sum(segment["total_size"] for segment in torch.cuda.memory_snapshot()
               if tuple(segment.get("segment_pool_id", ())) == tuple(pool))
