"""Tiny random causal LMs (Llama, Qwen2, GPT-2 families) saved locally, with a byte-level tokenizer.

Weights cannot be downloaded here, so tests build models from transformers configs
and save them to a directory: loading them exercises the real loading code.
Used by the profiler and worker tests.
"""
from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>"]
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


def byte_tokenizer():
    """A byte-level tokenizer: 256 byte tokens plus end-of-text and pad (ids 256, 257)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=lambda c: _byte_of(c)))}
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|pad|>", bos_token=None
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _byte_of(ch: str) -> int:
    return {v: k for k, v in _bytes_to_unicode().items()}[ch]


def config_for(family: str, *, layers: int = 4, tied: bool = False):
    """A small config of one family; hidden 64, 4 heads (2 KV heads where the family has GQA)."""
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    common = dict(vocab_size=VOCAB_SIZE, tie_word_embeddings=tied, eos_token_id=256, pad_token_id=257)
    if family == "llama":
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **common)
    if family == "qwen2":
        return Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **common)
    if family == "gpt2":
        return GPT2Config(n_embd=64, n_layer=layers, n_head=4, n_positions=512, bos_token_id=256, **common)
    raise ValueError(f"unknown family {family!r}")


def save_tiny_model(directory: Path, family: str = "llama", *, layers: int = 4, tied: bool = False,
                    seed: int = 0, dtype: str = "float32") -> Path:
    """Build a random model of `family`, save it (safetensors + tokenizer) to `directory`."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config_for(family, layers=layers, tied=tied),
                                             dtype=getattr(torch, dtype))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return directory
