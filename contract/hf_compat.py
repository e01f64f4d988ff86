"""transformers' KV-cache argument across releases: the one adapter the worker and the profiler share.

transformers 5.17 (the GPU machine's) takes the cache as `past_key_values=` and
returns it as `.past_key_values`; 5.24 and later take `cache=` and return
`.cache`. Which one a model class speaks is read once from its `forward`
signature. Owns nothing else. Called by worker.engine (the serving forward) and
profiler_job.measure.device (the profiler's forward); depends on neither, and
imports no torch or transformers.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

NEW_NAME = "cache"               # transformers >= 5.24
OLD_NAME = "past_key_values"     # transformers <= 5.23 (5.17 on the GPU machine)


@lru_cache(maxsize=None)
def cache_argument(model_class: type) -> str:
    """The keyword `model_class.forward` takes the KV cache as: "cache" or "past_key_values"."""
    parameters = inspect.signature(model_class.forward).parameters
    return NEW_NAME if NEW_NAME in parameters else OLD_NAME


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """`{name: cache}` to pass to `model(...)` in the keyword this model's release takes."""
    return {cache_argument(type(model)): cache}


def returned_cache(model: Any, output: Any) -> Any:
    """The KV cache a forward of `model` returned, under the name its release uses."""
    return getattr(output, cache_argument(type(model)))
