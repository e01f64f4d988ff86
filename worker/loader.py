"""Model files: resolve a hub id or path to a local directory, and load tokenizer and host weights.

Called by the runtime: `resolve` before admission (to read the shape), `load` after
a model was admitted. Everything stays offline: a hub id must already be in the
local cache (the profiler or an init container puts it there).
"""
from __future__ import annotations

from pathlib import Path

import torch

from .config import ModelConfig
from .errors import ModelLoadError


def resolve(model: ModelConfig) -> Path:
    """The local directory holding `model.model` (a path, or a hub id from the local cache)."""
    path = Path(model.model)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model.model, revision=model.revision, local_files_only=True))
    except Exception as exc:  # not cached, bad id, or revision missing
        raise ModelLoadError(
            "ModelNotCached",
            f"{model.ref}: {model.model!r} is neither a directory nor in the local hub cache "
            f"({exc.__class__.__name__}); "
            "mount the model's files and set spec.model to their path, or pre-fetch it into the cache",
        ) from exc


def load(directory: Path, dtype: str):
    """(tokenizer, model in host memory, eval mode) from a saved transformers directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            directory, dtype="auto" if dtype == "auto" else getattr(torch, dtype), local_files_only=True,
            device_map=None,
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError("LoadFailed", f"loading {directory} failed: {exc}; the directory needs "
                             "config.json, safetensors weights and the tokenizer files") from exc
    return tokenizer, model.eval()
