"""What a schema's shape costs the grammar library: native stack by depth (what sizes the compile lane), time by width.

The grammar library (llguidance) compiles a JSON schema by recursion on the native stack of the thread that
builds the matcher; a thread that runs out is a SIGSEGV of the whole worker. For schema shapes that nest by
`$ref` (a chain of definitions, each shape one way to refer to the next), this prints:

- the deepest chain of each shape that worker/schemabound.py lets through (depth <= MAX_DEPTH), and the least
  thread stack that compiles it (bisected, each try in a forked child, so a crash costs only the child);
- the same shape's depth that the lane's stack (worker/compilelane.py STACK_BYTES) would hold, unbounded;
- whether the depth bound alone would do on a thread of the smallest usual default stacks (musl's 128 KiB,
  a 1 MiB thread) and whether the lane's stack alone would do for the 1,000-definition chain of issue 34
  (without the bound): both are needed;
- the time one compile takes for an object of 1,024 optional properties (the width bound) and of 10,000.

Run: .venv/bin/python bench/grammar_stack.py [--shapes prop anyof ...] [--widths 1024 10000]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the children are forked

import llguidance  # noqa: E402
import llguidance.hf  # noqa: E402

from tinymodels import byte_tokenizer  # noqa: E402
from worker.compilelane import STACK_BYTES  # noqa: E402
from worker.grammar import JSON_LAYOUT  # noqa: E402
from worker.schemabound import MAX_DEPTH, _Graph  # noqa: E402

KiB = 1 << 10
# one way each for a definition to refer to the next
SHAPES = {
    "ref": lambda nxt: {"$ref": nxt},
    "prop": lambda nxt: {"type": "object", "properties": {"x": {"$ref": nxt}}, "required": ["x"]},
    "items": lambda nxt: {"type": "array", "items": {"$ref": nxt}},
    "prefix": lambda nxt: {"type": "array", "prefixItems": [{"$ref": nxt}]},
    "additional": lambda nxt: {"type": "object", "additionalProperties": {"$ref": nxt}},
    "anyof": lambda nxt: {"anyOf": [{"$ref": nxt}, {"type": "null"}]},
    "allof-props": lambda nxt: {"allOf": [{"type": "object", "properties": {"x": {"$ref": nxt}}},
                                          {"type": "object", "properties": {"y": {"type": "integer"}}}]},
}


def chain(shape: str, n: int) -> dict:
    definitions = {f"d{i}": SHAPES[shape](f"#/$defs/d{i + 1}") for i in range(n)}
    definitions[f"d{n}"] = {"type": "string"}
    return {"$defs": definitions, "$ref": "#/$defs/d0"}


def depth(schema: dict) -> int:
    return _Graph(schema, "bench").deepest()[0]


def deepest_allowed(shape: str) -> int:
    """The longest chain of `shape` whose depth is within MAX_DEPTH."""
    low, high = 1, MAX_DEPTH
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if depth(chain(shape, mid)) <= MAX_DEPTH else (low, mid - 1)
    return low


def compiles(tokenizer, schema: dict, stack_bytes: int) -> str:
    """What a thread of `stack_bytes` makes of `schema`: "ok", "refused" (the library's own limits refuse it:
    the thread survived) or "SIGSEGV". In a forked child, so a crash ends only the child."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_LAYOUT)
    pid = os.fork()
    if pid == 0:
        def build() -> None:
            matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
            os._exit(2 if matcher.is_error() else 0)

        threading.stack_size(stack_bytes)
        thread = threading.Thread(target=build)
        thread.start()
        thread.join()
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) not in (0, 2):
        return "SIGSEGV" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == 11 else f"status {status}"
    return "ok" if os.WEXITSTATUS(status) == 0 else "refused"


def survives(tokenizer, schema: dict, stack_bytes: int) -> bool:
    return compiles(tokenizer, schema, stack_bytes) in ("ok", "refused")


def least_stack(tokenizer, schema: dict) -> int:
    """The least stack, in 64 KiB steps, a thread compiles `schema` with (0: not within the lane's stack)."""
    low, high = 2, STACK_BYTES // (64 * KiB)  # in units of 64 KiB; threading wants >= 32 KiB
    if not survives(tokenizer, schema, high * 64 * KiB):
        return 0
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if survives(tokenizer, schema, mid * 64 * KiB) else (mid + 1, high)
    return low * 64 * KiB


def deepest_within(tokenizer, shape: str, stack_bytes: int, start: int, most: int = 64_000) -> str:
    """The depth of the longest chain of `shape` a thread of `stack_bytes` survives (doubling, then bisecting),
    or "> depth" when even `most` definitions compile (or are refused by the library's own size limits)."""
    low, high = 0, start
    while survives(tokenizer, chain(shape, high), stack_bytes):
        if high >= most:
            return f"> {depth(chain(shape, high))}"
        low, high = high, min(high * 2, most)
    while high - low > max(1, low // 50):
        mid = (low + high) // 2
        low, high = (mid, high) if survives(tokenizer, chain(shape, mid), stack_bytes) else (low, mid)
    return str(depth(chain(shape, low)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--widths", nargs="*", type=int, default=[1024, 10_000])
    args = parser.parse_args()
    tokenizer = llguidance.hf.from_tokenizer(byte_tokenizer(), n_vocab=258, eos_token=256)
    print(f"machine: {platform.machine()}, {len(os.sched_getaffinity(0))} cores, Python "
          f"{platform.python_version()}, llguidance {llguidance.get_version()}, {datetime.date.today()}")
    print(f"MAX_DEPTH {MAX_DEPTH}, lane stack {STACK_BYTES // KiB // KiB} MiB")
    print("| shape | definitions at the bound | depth | least stack KiB | bytes per level | lane stack / least "
          "| 128 KiB thread | 1 MiB thread | depth a thread of the lane's stack survives, unbounded |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        n = deepest_allowed(shape)
        schema = chain(shape, n)
        levels = depth(schema)
        need = least_stack(tokenizer, schema)
        small = compiles(tokenizer, schema, 128 * KiB)
        one = compiles(tokenizer, schema, 1024 * KiB)
        holds = deepest_within(tokenizer, shape, STACK_BYTES, max(n, 1000))
        print(f"| {shape} | {n} | {levels} | {need // KiB} | {need // levels} | {STACK_BYTES / need:.0f}x | {small} "
              f"| {one} | {holds} |", flush=True)
    issue = chain("prop", 1000)
    print(f"\nissue 34's chain (1,000 definitions, each an object whose property refers to the next): depth "
          f"{depth(issue)}; a thread of the lane's stack: {compiles(tokenizer, issue, STACK_BYTES)}; of 8 MiB "
          f"(glibc's usual default): {compiles(tokenizer, issue, 8 << 20)}")
    for width in args.widths:
        schema = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(width)}}
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_LAYOUT)
        started = time.perf_counter()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        print(f"an object of {width} optional properties: compiled in {time.perf_counter() - started:.2f} s"
              f"{' (refused: ' + matcher.get_error()[:80] + ')' if matcher.is_error() else ''}", flush=True)


if __name__ == "__main__":
    main()
