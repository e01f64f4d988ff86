"""transformers version seam: the name of the KV-cache argument of a model's forward.

transformers up to 5.23 (5.17 on the GPU machine) takes `past_key_values=` and returns
`.past_key_values`; 5.24 and later take `cache=` and return `.cache`. Every caller
that hands a transformers model a cache goes through `cache_kwargs` and reads it back
with `returned_cache`: the worker's fallback forward (worker/forward/hf.py) and the
profiler's measurement loop.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=None)
def cache_argument(model_class: type) -> str:
    """`cache` when `model_class.forward` takes it (transformers >= 5.24), else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """The keyword argument that passes `cache` to `model`'s forward under this transformers version."""
    return {cache_argument(type(model)): cache}


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned (`.cache` on transformers >= 5.24, else `.past_key_values`)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)
