"""Loading a causal LM with transformers, and turning loader failures into typed profiler errors.

Owns the default loader (AutoConfig + AutoModelForCausalLM; a local path or a
hub id from the local cache, HF_HUB_OFFLINE respected, remote code off unless
asked) and the mapping of its exceptions to ModelNotFound, GatedOrUnauthorized,
UnsupportedArchitecture and OutOfMemory. Called by profiler_job.run; tests pass
their own `from_pretrained` to simulate the failures.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from profiler_job.errors import (GatedOrUnauthorized, ModelNotFound, OutOfMemory, ProfilerError,
                                 UnsupportedArchitecture)
from profiler_job.termination import redact

FromPretrained = Callable[..., Any]
"""(model_id, *, revision, dtype, trust_remote_code, device) -> a torch causal LM in eval mode."""


def transformers_from_pretrained(model_id: str, *, revision: str, dtype: str, trust_remote_code: bool,
                                 device: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the Job reports its own progress by stage
    raw, _ = PretrainedConfig.get_config_dict(model_id, revision=revision)
    remote = trust_remote_code and "auto_map" in raw
    if raw.get("model_type") not in CONFIG_MAPPING and not remote:
        raise UnsupportedArchitecture(
            f"transformers {_version()} does not know model_type {raw.get('model_type')!r} of {model_id}; "
            "upgrade transformers, or pass --trust-remote-code if the repository ships its own code")
    config = AutoConfig.from_pretrained(model_id, revision=revision, trust_remote_code=trust_remote_code)
    if config.is_encoder_decoder or (type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING and not remote):
        raise UnsupportedArchitecture(
            f"{model_id} is a {type(config).__name__} ({config.model_type}), not a decoder-only causal LM; "
            "the profiler measures decoder-only models such as Llama, Qwen2 and GPT-2")
    model = AutoModelForCausalLM.from_pretrained(
        model_id, revision=revision, dtype=dtype if dtype == "auto" else getattr(torch, dtype),
        trust_remote_code=trust_remote_code, device_map=None if device == "cpu" else device,
    )
    return model.eval()


def _version() -> str:
    import transformers
    return transformers.__version__


def load_model(model_id: str, *, revision: str, dtype: str, trust_remote_code: bool, device: str,
               from_pretrained: FromPretrained = transformers_from_pretrained) -> Any:
    """The loaded model, or a typed ProfilerError saying why it could not be loaded."""
    if _looks_like_path(model_id) and not Path(model_id).expanduser().exists():
        raise ModelNotFound(f"{model_id} does not exist; mount the model directory at that path or give a hub id")
    try:
        return from_pretrained(model_id, revision=revision, dtype=dtype, trust_remote_code=trust_remote_code,
                               device=device)
    except ProfilerError:
        raise
    except Exception as exc:  # noqa: BLE001 - every loader failure is classified or re-raised below
        classified = classify_load_error(exc, model_id, revision)
        if classified is None:
            raise
        raise classified from exc


def classify_load_error(exc: BaseException, model_id: str, revision: str) -> ProfilerError | None:
    """The typed error a loader exception means, or None when it is not a known loading failure."""
    import torch
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    chain = list(_causes(exc))
    cause = redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    if any(isinstance(e, GatedRepoError) for e in chain) or any(
            isinstance(e, HfHubHTTPError) and _status(e) in (401, 403) for e in chain):
        return GatedOrUnauthorized(
            f"{model_id} is gated or private and the hub refused this token ({cause}); accept the model's licence "
            "with the account whose token is in the Job's HF_TOKEN secret, or mount the weights")
    if any(isinstance(e, RevisionNotFoundError) for e in chain):
        return ModelNotFound(f"{model_id} has no revision {revision!r}; give an existing branch, tag or commit")
    if any(isinstance(e, (RepositoryNotFoundError, EntryNotFoundError, LocalEntryNotFoundError)) for e in chain):
        return ModelNotFound(
            f"{model_id}@{revision} is not in the local model cache and cannot be downloaded ({cause}); "
            "pre-fetch it into the cache volume, or allow downloads (unset HF_HUB_OFFLINE)")
    if any(isinstance(e, (torch.OutOfMemoryError, MemoryError)) for e in chain):
        return OutOfMemory(
            f"loading {model_id} ran out of memory ({cause}); profile it on a GPU with more memory, "
            "with a smaller --dtype, or free the GPU first")
    if isinstance(exc, OSError):
        return ModelNotFound(f"{model_id} could not be loaded ({cause}); check the id or path and the revision")
    return None


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _status(exc: Any) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _looks_like_path(model_id: str) -> bool:
    return model_id.startswith(("/", "./", "../", "~")) or Path(model_id).is_absolute()
