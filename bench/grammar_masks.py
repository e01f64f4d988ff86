"""What structured output costs the worker per request and per token, through worker.grammar itself.

For byte-level BPE tokenizers of a few vocabulary sizes (the tiny models' 258 tokens, and BPEs trained
here on this repository's own text, since none can be downloaded), it prints: the one-off build of
the grammar library's view of the tokenizer (once per served model), the compile of a JSON schema
and of an "auto" tool grammar (once per request), and the mask of one step (mean and p99 over a walk
that takes a random allowed token each step, as a sampler would) plus engine.sampling.mask_logits on
the CPU. The mask is computed on the host while the device runs; these times bound what a step adds.
Run: .venv/bin/python bench/grammar_masks.py [--vocab 258 32000 --steps 400]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))

import torch  # noqa: E402

from tinymodels import byte_tokenizer  # noqa: E402
from worker.grammar import Grammars  # noqa: E402
from worker.prompts import PromptEncoder  # noqa: E402
from worker.protocol import Structure  # noqa: E402
from engine.sampling import mask_logits  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "address"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 5},
                         "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                                      "zip": {"pattern": "^[0-9]{5}$"}}}}}
TOOLS = tuple({"type": "function", "function": {"name": f"tool_{i}", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}}}
    for i in range(8))


def trained_tokenizer(vocab: int):
    """A byte-level BPE of about `vocab` tokens, trained on this repository's Python and Markdown."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    files = [str(p) for p in sorted(REPO_ROOT.rglob("*")) if p.suffix in (".py", ".md")
             and ".venv" not in p.parts and ".git" not in p.parts]
    core.train(files, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>")


def measure(tokenizer, steps: int, asked: int) -> str:
    vocab = len(tokenizer)
    eos = tokenizer.eos_token_id
    grammars = Grammars(PromptEncoder(tokenizer, "bench", vocab), vocab, frozenset({eos}))
    started = time.perf_counter()
    grammars.constraints(Structure(schema={}), 1)  # builds the tokenizer view
    build_s = time.perf_counter() - started
    compile_ms = {}
    for name, structure in (("schema", Structure(schema=SCHEMA)), ("tools", Structure(tools=TOOLS))):
        started = time.perf_counter()
        grammars.constraints(structure, 1)
        compile_ms[name] = (time.perf_counter() - started) * 1e3
    rng, mask_us, apply_us = random.Random(0), [], []
    logits = torch.randn(vocab)
    [constraint] = grammars.constraints(Structure(schema=SCHEMA), 1)
    for _ in range(steps):
        started = time.perf_counter()
        words = constraint.bitmask()
        mask_us.append((time.perf_counter() - started) * 1e6)
        started = time.perf_counter()
        masked = mask_logits(logits, words)
        apply_us.append((time.perf_counter() - started) * 1e6)
        allowed = torch.isfinite(masked).nonzero().flatten().tolist()
        constraint.advance(rng.choice([t for t in allowed if t != eos] or allowed))
        if constraint.finished:
            [constraint] = grammars.constraints(Structure(schema=SCHEMA), 1)
    p99 = sorted(mask_us)[int(0.99 * (len(mask_us) - 1))]
    size = f"{vocab}" if vocab == asked else f"{vocab} (asked {asked}: the text has no more merges)"
    return (f"| {size} | {build_s * 1e3:.0f} | {compile_ms['schema']:.1f} | {compile_ms['tools']:.1f} | "
            f"{statistics.fmean(mask_us):.0f} | {p99:.0f} | {statistics.fmean(apply_us):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[258, 32000])
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {platform.machine()}, {len(os.sched_getaffinity(0))} cores, Python "
          f"{platform.python_version()}, {datetime.date.today()}")
    print("| vocab | tokenizer view ms | schema compile ms | 8-tool auto compile ms | mask µs mean | mask µs p99 "
          "| mask_logits µs (CPU) |")
    print("|---|---|---|---|---|---|---|")
    for vocab in args.vocab:
        tokenizer = byte_tokenizer() if vocab <= 258 else trained_tokenizer(vocab)
        print(measure(tokenizer, args.steps, vocab), flush=True)


if __name__ == "__main__":
    main()
