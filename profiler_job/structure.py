"""Where a causal LM keeps its parts: embeddings, the decoder-layer list, the final norm and the head.

Owns finding those parts generically (the one ModuleList holding
config.num_hidden_layers blocks, e.g. Llama's `model.layers` or GPT-2's
`transformer.h`; the input and output embeddings; the norms left over) and
refusing anything else with UnsupportedArchitecture. Called by the weight and
bandwidth measurements.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from profiler_job.errors import UnsupportedArchitecture

Part = Literal["embedding", "layer", "finalNorm", "head"]


@dataclass(frozen=True)
class Parts:
    layers_prefix: str                 # e.g. "model.layers"
    num_layers: int
    embedding_prefixes: tuple[str, ...]  # token embedding first, then position embeddings
    head_prefix: str
    tied: bool

    def part_of(self, tensor_name: str) -> tuple[Part, int | None]:
        """Which part a state-dict tensor belongs to, and its layer index for a decoder layer."""
        if tensor_name.startswith(self.layers_prefix + "."):
            return "layer", int(tensor_name[len(self.layers_prefix) + 1:].split(".", 1)[0])
        if any(_under(tensor_name, prefix) for prefix in self.embedding_prefixes):
            return "embedding", None
        if _under(tensor_name, self.head_prefix):
            return "head", None
        return "finalNorm", None


def find_parts(model: Any) -> Parts:
    """The parts of `model`, or UnsupportedArchitecture naming what did not fit the decoder-only shape."""
    import torch

    arch = type(model).__name__
    names = {id(module): name for name, module in model.named_modules()}
    token_embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if token_embedding is None or head is None:
        raise UnsupportedArchitecture(f"{arch} has no input embedding or no LM head; the profiler measures "
                                      "decoder-only causal LMs such as Llama, Qwen2 and GPT-2")
    layer_count = model.config.num_hidden_layers
    lists = [name for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) == layer_count]
    if len(lists) != 1:
        raise UnsupportedArchitecture(
            f"{arch}: expected exactly one list of {layer_count} decoder layers, found {len(lists)} ({lists}); "
            "the profiler measures decoder-only causal LMs such as Llama, Qwen2 and GPT-2")
    layers_prefix = lists[0]
    embeddings = [names[id(token_embedding)]] + [
        name for name, module in model.named_modules()
        if isinstance(module, torch.nn.Embedding) and module is not token_embedding
        and not _under(name, layers_prefix)]
    parts = Parts(layers_prefix, layer_count, tuple(embeddings), names[id(head)],
                  tied=head.weight is token_embedding.weight)
    _refuse_unknown_tensors(model, parts, arch)
    return parts


def _refuse_unknown_tensors(model: Any, parts: Parts, arch: str) -> None:
    """Outside embeddings, layers and head only norms may hold weights (the final norm)."""
    modules = dict(model.named_modules())
    strays = sorted(name for name in model.state_dict()
                    if parts.part_of(name)[0] == "finalNorm"
                    and "norm" not in type(modules[name.rpartition(".")[0]]).__name__.lower())
    if strays:
        raise UnsupportedArchitecture(
            f"{arch} has weights outside its embeddings, decoder layers, final norm and head ({', '.join(strays[:4])}); "
            "the profiler measures decoder-only causal LMs such as Llama, Qwen2 and GPT-2")


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")
