"""Small builders for planner inputs: a toy profile with round numbers, models and slots."""
from __future__ import annotations

from controller.types import SLO, ElasticModel, GpuSlot, Profile

PRODUCT = "NVIDIA-TEST"


def toy_profile(model: str = "org/toy", *, product: str = PRODUCT, layers: int = 10, layer_bytes: int = 100,
                embedding: int = 100, head: int = 100, kv_per_token: int = 1, decode_ms: float = 10.0,
                prefill_ms_per_1k: float = 100.0, gbps: float = 1e-6, overhead: int = 0,
                prefill_act_per_token: int = 0, decode_act: int = 0) -> Profile:
    """weights = embedding + layers×layer_bytes + head; 1e-6 GB/s = 1,000 bytes/s, so 1,200 bytes swap in 1.2 s."""
    return Profile(
        model=model, gpu_product=product, dtype="bfloat16", source="estimated", method="test",
        embedding_bytes=embedding, layer_bytes=(layer_bytes,) * layers, final_norm_bytes=0, head_bytes=head,
        tied_embeddings=False, kv_bytes_per_token=kv_per_token,
        prefill_activation_bytes_per_token=prefill_act_per_token, prefill_chunk_tokens=512,
        decode_activation_bytes_per_sequence=decode_act, runtime_overhead_bytes=overhead,
        decode_ms_per_token=decode_ms, prefill_ms_per_1k_tokens=prefill_ms_per_1k, host_to_device_gbps=gbps,
    )


def toy_model(name: str, budget: int, *, model: str = "org/toy", namespace: str = "llm", context: int = 100,
              concurrency: int = 1, ttft_ms: float | None = None, tpot_ms: float | None = None,
              product: str | None = PRODUCT) -> ElasticModel:
    return ElasticModel(
        name=name, namespace=namespace, model=model, budget_bytes=budget,
        slo=SLO(context_tokens=context, concurrency=concurrency, ttft_ms=ttft_ms, tpot_ms=tpot_ms),
        gpu_product=product, has_slo=ttft_ms is not None or tpot_ms is not None,
    )


def toy_slot(node: str = "node-a", usable: int = 10_000, *, index: int = 0, product: str = PRODUCT) -> GpuSlot:
    return GpuSlot(node=node, index=index, product=product, memory_bytes=usable, reserved_bytes=0)
