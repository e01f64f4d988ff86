"""Model files: resolve a hub id or path to a local directory, and load tokenizer and host weights.

Called by the runtime: `resolve` before admission (to read the shape), `load` after
a model was admitted. A hub id missing from the cache downloads into it on first use
(worker.download), unless HF_HUB_OFFLINE is set; loading reads local files only.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .config import ModelConfig
from .download import snapshot
from .errors import ModelLoadError


def resolve(model: ModelConfig) -> Path:
    """The local directory holding `model.model` (a path, or a hub id from the local cache)."""
    path = Path(model.model)
    if path.is_dir():
        return path
    return snapshot(model.model, model.revision)


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
