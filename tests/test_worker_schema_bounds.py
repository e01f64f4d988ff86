"""The bounds a schema meets before the grammar library sees it, and where it is compiled (issue 34), as units:

worker/schemabound.py on the resolved graph (depth with $refs followed, cycles, expanded size, width,
unresolvable references, tools' count, names and shared budget), table-driven with the case that broke;
the property that any hostile schema is measured or refused, nothing else; worker/compilelane.py (its threads'
stack holds what the default thread's does not, its queue is bounded, its deadline answers 503 or 400); and
worker/grammar.py's kept grammars (one compile per schema, refusals kept, the least recently used given up,
a compile past the deadline kept for the next request)."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings

from hostile_schemas import LEAF, chain, cycle, mutual, nested, schemas, shared, wide
from tinymodels import byte_tokenizer
from worker.compilelane import CompileLane
from worker.errors import ModelUnavailable, QueueFull, SchemaRefused
from worker.grammar import Grammars
from worker.prompts import PromptEncoder
from worker.protocol import Structure
from worker.schemabound import MAX_DEPTH, MAX_EXPANDED, MAX_TOOLS, check_schema, check_tool_list, check_tools
from worker_support import REPO_ROOT

UNREFERENCED = {"$defs": chain(5000, "ref")["$defs"], "type": "string"}


@pytest.mark.parametrize("case,schema,depth", [
    ("a-chain-of-a-hundred-objects", chain(100, "property"), 202),
    ("a-ref-chain-at-the-bound", chain(254, "ref"), MAX_DEPTH),
    ("a-recursive-tree", {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}, 3),
    ("a-cycle-counts-each-member-once", cycle(50, "anyof"), 102),  # root, the ring of 100, a null
    ("fan-out-within-the-expanded-size", shared(10, 2), 22),
    ("plain-nesting", nested(10), 21),
    ("a-5000-chain-nobody-refers-to-is-never-compiled", UNREFERENCED, 1),
    ("anchor-and-id-relative-refs-resolve", {"$id": "https://example.invalid/root.json", "$defs": {
        "a": {"$id": "a.json", "type": "string"}, "b": {"$anchor": "B", "type": "integer"}},
        "anyOf": [{"$ref": "a.json"}, {"$ref": "#B"}]}, 3),
    ("draft-07-definitions", {"$schema": "http://json-schema.org/draft-07/schema#",
                              "definitions": {"a": LEAF}, "$ref": "#/definitions/a"}, 2),
])
def test_a_schema_within_the_bounds_is_measured(case, schema, depth):
    size = check_schema(schema, "response_format")
    assert size.depth == depth, case
    assert size.expanded <= MAX_EXPANDED, case


@pytest.mark.parametrize("case,schema,limit,words", [
    ("issue-34-a-thousand-definitions-each-referring-to-the-next", chain(1000, "property"), "depth",
     ["2002 levels deep", "(at most 256)", "#/$defs/d0 -> #/$defs/d0/properties/next -> #/$defs/d1"]),
    ("one-past-the-bound", chain(255, "ref"), "depth", ["257 levels deep"]),
    ("a-cycle-through-many-definitions", cycle(300, "property"), "depth", ["levels deep"]),
    ("mutual-recursion", mutual(200), "depth", ["levels deep"]),
    ("each-uses-the-next-twice", shared(25, 2), "expanded", [f"more than {MAX_EXPANDED} subschemas"]),
    ("a-wide-anyof", wide("anyOf", 1025), "width", ["1025 entries in anyOf at #"]),
    ("wide-properties-deep-inside", {"type": "object", "properties": {"a": wide("properties", 2000)}}, "width",
     ["2000 entries in properties at #/properties/a"]),
    ("a-ref-to-nothing", {"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}}, "ref",
     ["'#/$defs/none' at #/properties/a", "does not resolve"]),
    ("a-remote-ref", {"$ref": "https://example.invalid/schema.json"}, "ref", ["never fetches"]),
    ("an-id-that-is-no-string", {"$defs": {"a": {"$id": 7}}, "$ref": "#/$defs/a"}, "ref", ["cannot be resolved"]),
    ("a-schema-dialect-that-is-no-string", {"$schema": 5}, "ref", ["cannot be resolved"]),
])
def test_a_schema_beyond_a_bound_is_refused_naming_it(case, schema, limit, words):
    with pytest.raises(SchemaRefused) as refused:
        check_schema(schema, "response_format")
    error = refused.value
    assert (error.reason, error.status, error.limit, error.param) == ("UnsupportedSchema", 400, limit,
                                                                      "response_format"), case
    for word in words:
        assert word in error.message, (case, error.message)


@pytest.mark.parametrize("case,tools,words", [
    ("too-many", [{"function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)], ["129 tools"]),
    ("a-name-with-a-space", [{"function": {"name": "get weather"}}], ["tools[0].function.name 'get weather'"]),
    ("a-name-too-long", [{"function": {"name": "f" * 65}}], ["1 to 64"]),
    ("an-empty-name", [{"function": {"name": ""}}], ["1 to 64"]),
    ("a-name-twice", [{"function": {"name": "f"}}, {"function": {"name": "f"}}], ["tools[1]", "offered before"]),
])
def test_a_tool_list_beyond_a_bound_is_refused_naming_the_tool(case, tools, words):
    with pytest.raises(SchemaRefused) as refused:
        check_tool_list(tools)
    assert refused.value.limit == "tools", case
    for word in words:
        assert word in refused.value.message, (case, refused.value.message)


def test_dotted_and_openai_tool_names_pass():
    check_tool_list([{"function": {"name": name}} for name in ("get_weather", "calendar.add", "ns:tool-2")])


def test_the_tools_share_one_expanded_budget():
    quarter = shared(16, 2)  # 262,142 subschemas each, once expanded
    check_tools([quarter] * 3)
    with pytest.raises(SchemaRefused) as refused:
        check_tools([quarter] * 4)
    assert refused.value.limit == "expanded" and refused.value.param == "tools[3].function.parameters"


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(schema=schemas())
def test_any_hostile_schema_is_measured_within_the_bounds_or_refused_and_nothing_else(schema):
    try:
        size = check_schema(schema, "response_format")
    except SchemaRefused as refused:
        assert refused.limit in ("depth", "expanded", "width", "ref") and refused.message
        return
    assert size.depth <= MAX_DEPTH and size.expanded <= MAX_EXPANDED


# ----------------------------------------------------------------- the compile lane

STACK_PROBE = textwrap.dedent("""
    import json, sys, threading
    sys.path[:0] = [{repo!r}, {tests!r}]
    import llguidance, llguidance.hf
    from hostile_schemas import chain
    from tinymodels import byte_tokenizer
    from worker.compilelane import CompileLane
    tokenizer = llguidance.hf.from_tokenizer(byte_tokenizer(), n_vocab=258, eos_token=256)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(chain(3000, "ref")))
    build = lambda: llguidance.LLMatcher(tokenizer, grammar, log_level=0).is_error()
    if sys.argv[1] == "lane":
        print(CompileLane("probe").submit(build).result())
    else:
        threading.stack_size(int(sys.argv[1]) << 20)
        thread = threading.Thread(target=lambda: print(build()))
        thread.start()
        thread.join()
""")


@pytest.mark.parametrize("case,where,survives", [
    ("the-lane", "lane", True),
    ("a-thread-of-glibc's-default-8-MiB", "8", False),  # what the worker compiled on before
])
def test_the_lane_threads_stack_holds_what_a_default_thread_does_not(case, where, survives):
    """3,000 definitions (past the bounds, so never sent to the library by the worker) need about 11 MiB of
    native stack (bench/grammar_stack.py); compiled directly, in a child process, since a crash is the finding."""
    probe = STACK_PROBE.format(repo=str(REPO_ROOT), tests=str(REPO_ROOT / "tests"))
    done = subprocess.run([sys.executable, "-c", probe, where], capture_output=True, text=True, timeout=120)
    assert (done.returncode == 0 and done.stdout.strip() == "False") == survives, (case, done.returncode,
                                                                                   done.stderr[-500:])
    if not survives:
        assert done.returncode == -11, case  # SIGSEGV: the crash of issue 34


def test_a_full_lane_queue_is_a_429_that_says_retry():
    lane, release = CompileLane("full", threads=1, queued=1), threading.Event()
    running = lane.submit(release.wait)
    while running.started_at is None:  # type: ignore[attr-defined]
        time.sleep(0.01)
    waiting = lane.submit(lambda: "queued")
    with pytest.raises(QueueFull) as full:
        lane.submit(lambda: "one too many")
    assert (full.value.status, full.value.reason, full.value.retry_after_s) == (429, "GrammarQueueFull", 1)
    release.set()
    assert waiting.result(5) == "queued"


def test_the_deadline_answers_503_for_a_compile_still_queued_and_400_for_one_compiling_too_long():
    lane, release = CompileLane("slow", threads=1, queued=4), threading.Event()
    slow = lane.submit(lambda: release.wait(10))
    queued = lane.submit(lambda: "never")

    async def wait(future):
        return await lane.wait(future, 0.2, "response_format")

    with pytest.raises(ModelUnavailable) as busy:
        asyncio.run(wait(queued))
    assert (busy.value.status, busy.value.reason) == (503, "GrammarCompilerBusy") and queued.cancelled()
    with pytest.raises(SchemaRefused) as late:
        asyncio.run(wait(slow))
    assert (late.value.status, late.value.limit) == (400, "deadline") and "longer than 0.2 s" in late.value.message
    release.set()
    assert slow.result(5) is True  # the compile ran on to its end


# ----------------------------------------------------------------- kept grammars

class Counted:
    """GrammarMetrics that counts."""

    def __init__(self):
        self.kept = self.compiled = 0
        self.seconds: list[float] = []

    def grammar_lookup(self, model: str, kept: bool) -> None:
        self.kept += kept
        self.compiled += not kept

    def grammar_compiled(self, model: str, seconds: float) -> None:
        self.seconds.append(seconds)


def _grammars(**kwargs) -> Grammars:
    return Grammars(PromptEncoder(byte_tokenizer(), "t", 258), 258, frozenset({256}), **kwargs)


def _ask(grammars: Grammars, schema: dict, metrics: Counted, n: int = 1):
    return asyncio.run(grammars.compiled(Structure(schema=schema), n, metrics))


def test_a_schema_compiles_once_and_each_request_gets_its_own_matchers():
    grammars, metrics = _grammars(), Counted()
    first = _ask(grammars, {"type": "integer"}, metrics, n=2)
    again = _ask(grammars, {"type": "integer"}, metrics, n=1)
    assert (metrics.compiled, metrics.kept, len(metrics.seconds)) == (1, 1, 1)
    assert len({id(c) for c in first + again}) == 3
    first[0].advance(byte_tokenizer().encode("7")[0])  # one sequence's progress is its own
    assert first[1].bitmask().tolist() == again[0].bitmask().tolist()


def test_a_refusal_is_kept_and_answered_again_without_compiling():
    grammars, metrics = _grammars(), Counted()
    for _ in range(2):
        with pytest.raises(SchemaRefused) as refused:
            _ask(grammars, chain(1000), metrics)
        assert refused.value.limit == "depth"
    assert (metrics.compiled, metrics.kept, len(metrics.seconds)) == (1, 1, 1)


def test_the_least_recently_used_grammar_is_given_up_first():
    grammars, metrics = _grammars(cache_entries=2), Counted()
    for schema in ({"type": "integer"}, {"type": "boolean"}, {"type": "integer"}, {"type": "null"},
                   {"type": "boolean"}):
        _ask(grammars, schema, metrics)
    assert (metrics.compiled, metrics.kept) == (4, 1)  # boolean was given up when null came


def test_a_compile_past_the_deadline_is_refused_then_kept_for_the_next_request():
    grammars, metrics = _grammars(deadline_s=0.001), Counted()
    slow = wide("properties", 1000)  # optional properties: the library takes a while (bench/grammar_masks.py)
    with pytest.raises(SchemaRefused) as late:
        _ask(grammars, slow, metrics)
    assert late.value.limit == "deadline" and late.value.param == "response_format"
    deadline = time.monotonic() + 60
    while not metrics.seconds:  # the compile goes on, on the lane
        assert time.monotonic() < deadline, "the compile never finished"
        time.sleep(0.05)
    assert len(_ask(grammars, slow, metrics)) == 1 and metrics.kept == 1


def test_an_idle_lane_thread_ends_and_the_next_job_starts_one(monkeypatch):
    monkeypatch.setattr("worker.compilelane.IDLE_S", 0.1)
    lane = CompileLane("idle", threads=1)
    assert lane.submit(lambda: 1).result(5) == 1
    deadline = time.monotonic() + 5
    while any(t.name == "idle-0" for t in threading.enumerate()):  # a removed model's lane leaves nothing behind
        assert time.monotonic() < deadline, "the idle thread never ended"
        time.sleep(0.05)
    assert lane.submit(lambda: 2).result(5) == 2
