"""CUDA graphs for decode-only steps of the decoder forward, one per batch-size bucket.

A step where every seated sequence decodes one token (the steady state) replays a graph
captured for the smallest bucket (1, 2, 4, ... up to the concurrency) that holds the
batch; other steps (a prefill chunk in the batch) and buckets that could not be
captured run eagerly through the same DecoderForward. Graphs are captured lazily, on a
bucket's first decode-only step, on a side stream of the model's, in thread-local capture mode
(other models keep running in their threads; captures themselves take turns), sharing one
memory pool per model. The
pool's bytes are charged to the model's ledger ("cuda-graphs"); a capture that would pass
the budget is dropped and that bucket stays eager. Weights move on a swap-in, so
`release` (swap-out) drops the graphs with the KV slots. Only constructed when CUDA is
present (worker/forward/__init__.py); called by worker/engine.py.
"""
from __future__ import annotations

import logging
import threading

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


class _Captured:
    def __init__(self, graph, tokens, positions, logits):
        self.graph, self.tokens, self.positions, self.logits = graph, tokens, positions, logits


class GraphedDecoder:
    path = "decoder"

    def __init__(self, inner: DecoderForward):
        self.inner = inner
        self.buckets = buckets(inner.slots)
        self.graphs: dict[int, _Captured] = {}
        self.eager_buckets: set[int] = set()
        self.pool = None
        self.graph_bytes = 0

    def allocate(self) -> None:
        self.inner.allocate()

    def release(self) -> None:
        self.graphs.clear()
        self.eager_buckets.clear()
        self.pool = None
        self.graph_bytes = 0
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
        captured.graph.replay()
        return captured.logits[torch.tensor([r.slot for r in rows], device=device)]

    def _capture(self, bucket: int) -> _Captured | None:
        if bucket in self.eager_buckets:
            return None
        inner, device = self.inner, self.inner.device
        ledger = inner.residency.ledger
        tokens = torch.zeros(bucket, dtype=torch.long, device=device)
        positions = torch.full((bucket,), inner.context - 1, dtype=torch.long, device=device)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            with _capture_lock:
                side = torch.cuda.Stream(device=device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_STEPS):
                        inner.decode_all(tokens, positions)
                torch.cuda.current_stream(device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=side, capture_error_mode="thread_local"):
                    logits = inner.decode_all(tokens, positions)
                torch.cuda.current_stream(device).wait_stream(side)
                torch.cuda.current_stream(device).synchronize()
        except Exception:  # an op that cannot be captured: this model decodes eagerly
            log.exception("%s: CUDA graph capture failed for batch %d; decoding eagerly", ledger.model, bucket)
            self.eager_buckets.update(self.buckets)
            return None
        pool_bytes = _pool_bytes(self.pool)
        try:
            ledger.reserve("cuda-graphs", pool_bytes)
        except BudgetExceeded as exc:
            log.warning("%s: graphs for batch %d would pass the budget (%s); that batch decodes eagerly",
                        ledger.model, bucket, exc.message)
            self.eager_buckets.add(bucket)
            return None
        self.graph_bytes = pool_bytes
        self.graphs[bucket] = _Captured(graph, tokens, positions, logits)
        log.info("%s: captured the decode step for batch %d (graph pool %d bytes)", ledger.model, bucket, pool_bytes)
        return self.graphs[bucket]


def _pool_bytes(pool) -> int:
    """Bytes of the allocator segments that belong to graph memory pool `pool`."""
    return sum(segment["total_size"] for segment in torch.cuda.memory_snapshot()
               if tuple(segment.get("segment_pool_id", ())) == tuple(pool))
