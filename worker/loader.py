"""Model files: resolve a hub id or path to a local directory, and load tokenizer and host weights.

Called by the runtime: `resolve` before admission (to read the shape), `load` after
a model was admitted (its decoder linears quantized when its weight dtype is int8 or int4). A hub id missing from the cache downloads into it on first use
(worker.download), unless HF_HUB_OFFLINE is set; loading reads local files only. Whatever goes
wrong with one model's files (a path missing on the node, files transformers cannot read) is a
ModelLoadError with reason ModelUnreadable, so the runtime refuses that model alone.
"""
from __future__ import annotations

from pathlib import Path

import torch

from contract.hub import looks_like_path
from engine.quantize import quantize_decoder

from .config import ModelConfig
from .download import snapshot
from .errors import ModelLoadError


def resolve(model: ModelConfig) -> Path:
    """The local directory holding `model.model` (a path, or a hub id from the local cache)."""
    path = Path(model.model).expanduser()
    if path.is_dir():
        return path
    if looks_like_path(model.model):
        raise ModelLoadError("ModelUnreadable", f"{model.model} is not a directory on this node; put the saved "
                             "model there (the composition's model cache is mounted at /cache), or set "
                             "spec.model to a hub id")
    return snapshot(model.model, model.revision)


def load(directory: Path, dtype: str, weights: str = "", device: torch.device | None = None):
    """(tokenizer, model in host memory, eval mode) from a saved transformers directory, in `dtype`, its
    decoder linears quantized to `weights` (int8, int4; "": as loaded) for `device` (engine/quantize.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            directory, dtype="auto" if dtype == "auto" else getattr(torch, dtype), local_files_only=True,
            device_map=None,
        )
    except Exception as exc:  # noqa: BLE001 - whatever the files are, this model alone is refused
        raise ModelLoadError("ModelUnreadable", f"loading {directory} failed: {type(exc).__name__}: {exc}; the "
                             "directory needs config.json, complete safetensors weights and the tokenizer "
                             "files: re-save or re-download the model") from exc
    if weights in ("int8", "int4"):
        quantize_decoder(model, weights, device or torch.device("cpu"))
    return tokenizer, model.eval()
