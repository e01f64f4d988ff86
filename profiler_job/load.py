"""The model's files into the model cache, then the model loaded from there with transformers.

Owns where the profiler's files come from (a local path as it is; a hub id's snapshot downloaded
into the hub cache through contract.hub, as the worker downloads it: byte progress reported, HF_TOKEN
sent, offline only with HF_HUB_OFFLINE, a Hub refusal failing with the worker's reason), the default
loader (AutoConfig + AutoModelForCausalLM from that local directory, remote code off unless asked)
and the mapping of loader exceptions to ModelNotFound, UnsupportedArchitecture and OutOfMemory.
Called by profiler_job.run; tests pass their own `download` and `from_pretrained`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from contract import hub
from contract.precision import checkpoint_quantization, quantized_checkpoint_fix
from profiler_job.errors import (HUB_ERRORS, ModelNotFound, OutOfMemory, ProfilerError, UnsupportedArchitecture,
                                 UnsupportedQuantization)
from profiler_job.termination import redact

FromPretrained = Callable[..., Any]
"""(local directory, *, name, dtype, trust_remote_code, device) -> a torch causal LM in eval mode; `name` is the
model id or path the messages name."""
Download = Callable[..., Any]
"""huggingface_hub.snapshot_download's shape: (model_id, *, revision, allow_patterns, tqdm_class) -> a directory."""


def transformers_from_pretrained(directory: str, *, name: str, dtype: str, trust_remote_code: bool,
                                 device: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the Job reports its own progress by stage
    raw, _ = PretrainedConfig.get_config_dict(directory, local_files_only=True)
    quantized = checkpoint_quantization(raw)
    if quantized is not None:
        raise UnsupportedQuantization(f"{name}: {quantized_checkpoint_fix(quantized)}")
    remote = trust_remote_code and "auto_map" in raw
    if raw.get("model_type") not in CONFIG_MAPPING and not remote:
        raise UnsupportedArchitecture(
            f"transformers {_version()} does not know model_type {raw.get('model_type')!r} of {name}; "
            "upgrade transformers, or pass --trust-remote-code if the repository ships its own code")
    config = AutoConfig.from_pretrained(directory, trust_remote_code=trust_remote_code, local_files_only=True)
    if config.is_encoder_decoder or (type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING and not remote):
        raise UnsupportedArchitecture(
            f"{name} is a {type(config).__name__} ({config.model_type}), not a decoder-only causal LM; "
            "the profiler measures decoder-only models such as Llama, Qwen2 and GPT-2")
    model = AutoModelForCausalLM.from_pretrained(
        directory, dtype=dtype if dtype == "auto" else getattr(torch, dtype), local_files_only=True,
        trust_remote_code=trust_remote_code, device_map=None if device == "cpu" else device,
    )
    return model.eval()


def _version() -> str:
    import transformers
    return transformers.__version__


def local_files(model_id: str, *, revision: str, trust_remote_code: bool, report: hub.Report,
                download: Download | None = None) -> Path:
    """The directory holding `model_id`: the path itself, or the hub snapshot in the model cache (downloaded
    unless it is there, each progress line to `report`); a refusal of the Hub is its typed ProfilerError."""
    path = Path(model_id).expanduser()
    if hub.looks_like_path(model_id) or path.is_dir():  # an existing directory is used as it is, as the worker does
        if not path.exists():
            raise ModelNotFound(f"{model_id} does not exist; mount the model directory at that path or give a hub id")
        return path
    patterns = hub.FILES + (hub.REMOTE_CODE_FILES if trust_remote_code else ())
    try:
        return hub.snapshot(model_id, revision, report=report, download=download, patterns=patterns)
    except hub.HubError as exc:
        raise HUB_ERRORS[exc.reason](exc.message) from exc


def load_model(model_id: str, *, revision: str, dtype: str, trust_remote_code: bool, device: str,
               from_pretrained: FromPretrained = transformers_from_pretrained, download: Download | None = None,
               report: hub.Report = lambda line: None) -> Any:
    """The loaded model, or a typed ProfilerError saying why its files could not be fetched or loaded."""
    directory = local_files(model_id, revision=revision, trust_remote_code=trust_remote_code, report=report,
                            download=download)
    try:
        return from_pretrained(str(directory), name=model_id, dtype=dtype, trust_remote_code=trust_remote_code,
                               device=device)
    except ProfilerError:
        raise
    except Exception as exc:  # noqa: BLE001 - every loader failure is classified or re-raised below
        classified = classify_load_error(exc, model_id)
        if classified is None:
            raise
        raise classified from exc


def classify_load_error(exc: BaseException, model_id: str) -> ProfilerError | None:
    """The typed error a loader exception means, or None when it is not a known loading failure."""
    import torch

    cause = redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    if any(isinstance(e, (torch.OutOfMemoryError, MemoryError)) for e in _causes(exc)):
        return OutOfMemory(
            f"loading {model_id} ran out of memory ({cause}); profile it on a GPU with more memory, "
            "with a smaller --dtype, or free the GPU first")
    if isinstance(exc, OSError):
        return ModelNotFound(f"{model_id} could not be loaded ({cause}); its directory needs config.json and "
                             "safetensors weights: check the path, or the files the Hub repository holds")
    return None


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
