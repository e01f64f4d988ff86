"""Bounded load: 3 tiny models in one swap group, 200 mixed concurrent requests (chat and
completion, streamed and not) through the openai async client. All are answered, every model
is served, and the swaps stay within what the minimum-residency rule allows."""
from __future__ import annotations

import asyncio
import random
import time

import openai

from worker.api import create_app
from worker_support import (  # noqa: F401  (fixtures are used by name)
    ServerThread, config_document, model_entry, started_worker, single_threaded_torch, tiny_models,
)

MIN_RESIDENCY_S = 0.2
REQUESTS = 200


async def one_request(client: openai.AsyncOpenAI, rng: random.Random, model: str) -> tuple[str, int]:
    kind = rng.choice(["chat", "chat-stream", "completion", "completion-stream"])
    tokens = rng.randint(1, 4)
    if kind.startswith("chat"):
        request = dict(model=model, messages=[{"role": "user", "content": f"q{rng.randint(0, 99)}"}],
                       max_tokens=tokens, temperature=0)
        if kind == "chat":
            reply = await client.chat.completions.create(**request)
            return model, reply.usage.completion_tokens
        chunks = [c async for c in await client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True})]
        return model, chunks[-1].usage.completion_tokens
    request = dict(model=model, prompt=f"p{rng.randint(0, 99)}", max_tokens=tokens, temperature=0)
    if kind == "completion":
        return model, (await client.completions.create(**request)).usage.completion_tokens
    chunks = [c async for c in await client.completions.create(
        **request, stream=True, stream_options={"include_usage": True})]
    return model, chunks[-1].usage.completion_tokens


def test_200_mixed_requests_to_one_swap_group_are_all_answered_without_thrash(tiny_models):
    names = ["swap-llama", "swap-qwen2", "swap-gpt2"]
    models = [model_entry(n, tiny_models[f], "swap", concurrency=4)
              for n, f in zip(names, ("llama", "qwen2", "gpt2"))]
    worker = started_worker(config_document(models, max_queued=REQUESTS,
                                            min_residency_ms=int(MIN_RESIDENCY_S * 1000)))
    rng = random.Random(5)
    plan = [rng.choice(names) for _ in range(REQUESTS)]
    try:
        with ServerThread(create_app(worker)) as thread:
            async def load():
                async with openai.AsyncOpenAI(base_url=f"{thread.base_url}/v1", api_key="unused",
                                              max_retries=0, timeout=120) as client:
                    return await asyncio.gather(*(one_request(client, rng, m) for m in plan))

            started = time.monotonic()
            answers = asyncio.run(load())
            elapsed = time.monotonic() - started
    finally:
        worker.stop()
    assert len(answers) == REQUESTS and all(tokens >= 1 for _, tokens in answers)
    assert sorted(m for m, _ in answers) == sorted(plan)
    swaps = worker.scheduler.swaps
    assert 3 <= swaps <= 1 + elapsed / MIN_RESIDENCY_S, f"{swaps} swaps in {elapsed:.2f}s"
