"""CUDA graphs for decode-only steps of the decoder forward, one per batch-size bucket.

A step where every seated sequence decodes one token (the steady state) replays a graph
captured for the smallest bucket (1, 2, 4, ... up to the concurrency) that holds the
batch; other steps (a prefill chunk in the batch) and buckets that could not be
captured run eagerly through the same DecoderForward. Graphs are captured lazily, on a
bucket's first decode-only step, on a side stream of the model's, in thread-local capture mode
(other models keep running in their threads; captures themselves take turns), sharing one
memory pool per model. The pool counts against the model's budget: the footprint's overhead
reservation holds graph pools (contract/footprint.py), and a pool beyond it is charged on top
("cuda-graphs"); a capture that would pass the budget is dropped and that bucket stays eager.
Weights move on a swap-in, so `release` (swap-out) drops the graphs with the KV slots.
Constructed on CUDA by engine/forward/__init__.py; `eager_capture` keeps the same contract
without a graph, so the CPU tests run this module and the shape-static step it replays.
Called by engine/batch.py.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from contract.batching import buckets

from ..errors import BudgetExceeded
from .decoder import DecoderForward
from .rows import Row

log = logging.getLogger(__name__)
WARMUP_STEPS = 3
# one capture at a time in the process: entering a capture synchronizes the device and empties the
# allocator's cache, which must not run while another model's capture is under way
_capture_lock = threading.Lock()


@dataclass
class Captured:
    """One bucket's replayable decode step: fill `tokens` and `positions`, call `replay`, read `logits`."""

    replay: Callable[[], None]
    tokens: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor
    pool_bytes: int  # graph memory pool held after this capture
    pool: object = None  # the CUDA graph memory pool (shared by the model's buckets)
    graph: object = None  # the CUDA graph, kept alive with its replay


Capture = Callable[[DecoderForward, int, "Captured | None"], Captured]


def cuda_capture(inner: DecoderForward, bucket: int, previous: Captured | None) -> Captured:
    """Capture `inner.decode_all` for `bucket` rows as a CUDA graph (warm-up first, on a side stream),
    in the memory pool the model's earlier captures use."""
    device = inner.device
    tokens, positions = _static_inputs(inner, bucket)
    pool = previous.pool if previous is not None else torch.cuda.graph_pool_handle()
    with _capture_lock:
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                inner.decode_all(tokens, positions)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"):
            logits = inner.decode_all(tokens, positions)
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.current_stream(device).synchronize()
    return Captured(graph.replay, tokens, positions, logits, _pool_bytes(pool), pool=pool, graph=graph)


def eager_capture(inner: DecoderForward, bucket: int, previous: Captured | None) -> Captured:
    """The same static-buffer contract without a graph: `replay` runs `decode_all` eagerly. Lets the CPU
    tests drive GraphedDecoder and the shape-static decode step it replays."""
    tokens, positions = _static_inputs(inner, bucket)
    logits = torch.empty(bucket, inner.head.out_features, dtype=torch.float32, device=inner.device)
    return Captured(lambda: logits.copy_(inner.decode_all(tokens, positions)), tokens, positions, logits, 0)


def _static_inputs(inner: DecoderForward, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.zeros(bucket, dtype=torch.long, device=inner.device)
    positions = torch.full((bucket,), inner.context - 1, dtype=torch.long, device=inner.device)
    return tokens, positions


class GraphedDecoder:
    path = "decoder"

    def __init__(self, inner: DecoderForward, capture: Capture = cuda_capture):
        self.inner = inner
        self.capture = capture
        self.buckets = buckets(inner.slots)
        self.graphs: dict[int, Captured] = {}
        self.eager_buckets: set[int] = set()

    @property
    def graph_bytes(self) -> int:
        return max((c.pool_bytes for c in self.graphs.values()), default=0)

    def allocate(self) -> None:
        self.inner.allocate()

    def release(self) -> None:
        self.graphs.clear()
        self.eager_buckets.clear()
        self.inner.residency.ledger.reserve("cuda-graphs", 0)
        self.inner.release()

    def free(self, slot: int) -> None:
        self.inner.free(slot)

    def move(self, src: int, dst: int, length: int) -> None:
        self.inner.move(src, dst, length)

    @torch.inference_mode()
    def run(self, rows: list[Row]) -> torch.Tensor:
        size = len(rows)
        slots = sorted(r.slot for r in rows)
        if any(len(r.tokens) != 1 for r in rows) or slots != list(range(size)):
            return self.inner.run(rows)
        bucket = next(b for b in self.buckets if b >= size)
        captured = self.graphs.get(bucket) or self._capture(bucket)
        if captured is None:
            return self.inner.run(rows)
        device, context = self.inner.device, self.inner.context
        tokens = [0] * bucket
        positions = [context - 1] * bucket  # padding rows write a position no live sequence reads
        for row in rows:
            tokens[row.slot], positions[row.slot] = row.tokens[0], row.start
        captured.tokens.copy_(torch.tensor(tokens, dtype=torch.long, device=device))
        captured.positions.copy_(torch.tensor(positions, dtype=torch.long, device=device))
        captured.replay()
        return captured.logits[torch.tensor([r.slot for r in rows], device=device)]

    def _capture(self, bucket: int) -> Captured | None:
        if bucket in self.eager_buckets:
            return None
        ledger = self.inner.residency.ledger
        previous = next(iter(self.graphs.values()), None)
        try:
            captured = self.capture(self.inner, bucket, previous)
        except Exception:  # an op that cannot be captured: this model decodes eagerly
            log.exception("%s: CUDA graph capture failed for batch %d; decoding eagerly", ledger.model, bucket)
            self.eager_buckets.update(self.buckets)
            return None
        try:  # the footprint's overhead holds the graph pools; only a pool beyond it is charged on top
            ledger.reserve("cuda-graphs", max(0, captured.pool_bytes - ledger.reserved("overhead")))
        except BudgetExceeded as exc:
            log.warning("%s: graphs for batch %d would pass the budget (%s); that batch decodes eagerly",
                        ledger.model, bucket, exc.message)
            self.eager_buckets.add(bucket)
            return None
        self.graphs[bucket] = captured
        log.info("%s: captured the decode step for batch %d (graph pool %d bytes)", ledger.model, bucket,
                 captured.pool_bytes)
        return captured


def _pool_bytes(pool) -> int:
    """Bytes of the allocator segments that belong to graph memory pool `pool`."""
    return sum(segment["total_size"] for segment in torch.cuda.memory_snapshot()
               if tuple(segment.get("segment_pool_id", ())) == tuple(pool))
