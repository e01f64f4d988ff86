"""transformers' KV-cache argument across releases: the one adapter the worker and the profiler share.

transformers up to 5.23 (5.17 on the GPU machine) takes the cache as
`past_key_values=` and returns it as `.past_key_values`; 5.24 and later take
`cache=` and return `.cache`. Which one a model class speaks is read once from
its `forward` signature. Called by engine/forward/hf.py (the worker's fallback
forward) and profiler_job/measure/device.py (the profiler's forward); imports
no torch or transformers.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

NEW_NAME = "cache"               # transformers >= 5.24
OLD_NAME = "past_key_values"     # transformers <= 5.23


@lru_cache(maxsize=None)
def cache_argument(model_class: type) -> str:
    """The keyword `model_class.forward` takes the KV cache as: "cache" or "past_key_values"."""
    return NEW_NAME if NEW_NAME in inspect.signature(model_class.forward).parameters else OLD_NAME


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """`{name: cache}` to pass to `model(...)` in the keyword this model's release takes."""
    return {cache_argument(type(model)): cache}


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned: `.cache` (>= 5.24), else `.past_key_values`."""
    cache = getattr(output, NEW_NAME, None)
    return cache if cache is not None else getattr(output, OLD_NAME, None)
