"""Fuzzing the whole pass: generated YAML trees (models, the GPU inventory, profiles, compositions and
right-sizing records, each valid, mutated or garbage) beside one good model. The pass never crashes, every
problem is a typed error with a PascalCase reason, and the good model's generated files are byte for byte
what they are without the broken neighbours.

The good model has the H200 to itself: no generated document names that product or the good model, so a
neighbour that happens to be valid takes nothing from it. gpus.yaml is only ever broken as a whole (it
is then read from its last good copy) or extended with nodes of other products. Bounded for CI: a fixed
number of examples, no per-example deadline (the machine is shared)."""
from __future__ import annotations

import copy
import os
import difflib
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.cli.offline import pass_over

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "examples" / "fleet" / "profiles"
GOOD_PRODUCT, OTHER_PRODUCT = "NVIDIA-H200", "NVIDIA-L4"
GOOD = "llm/good"
PASCAL = re.compile(r"^[A-Z][A-Za-z0-9]+$")
# CI runs a fixed, derandomised sample; GPUSHARE_FUZZ_EXAMPLES=2000 explores further with random seeds.
EXAMPLES = int(os.environ.get("GPUSHARE_FUZZ_EXAMPLES", "60"))
DERANDOMIZE = "GPUSHARE_FUZZ_EXAMPLES" not in os.environ

INVENTORY = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GPUInventory", "nodes": [
    {"name": "good-node", "product": GOOD_PRODUCT, "memory": "143771Mi", "count": 1, "hostMemory": "512Gi"},
    {"name": "fuzz-node", "product": OTHER_PRODUCT, "memory": "23034Mi", "count": 2, "hostMemory": "64Gi"}]}
MODEL = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
         "metadata": {"name": "good", "namespace": "llm"},
         "spec": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "memoryBudget": "4Gi",
                  "slo": {"contextTokens": 4096, "concurrency": 4, "tpotMs": 50},
                  "gpu": {"product": GOOD_PRODUCT}}}
COMPOSITION = yaml.safe_load((REPO / "tests" / "fixtures" / "load" / "compositions" / "vllm-like.yaml").read_text())
PROFILE = yaml.safe_load((PROFILES / OTHER_PRODUCT / "qwen--qwen2.5-0.5b-instruct.yaml").read_text())
RECORD = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "RightsizingRecord",
          "model": {"namespace": "llm", "name": "neighbour"}, "policy": "Auto", "specBudgetBytes": 4 << 30,
          "budgetBytes": 6 << 30, "direction": "up", "reason": "usage"}


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _good_tree(root: Path) -> None:
    _write(root, "gpus.yaml", yaml.safe_dump(INVENTORY))
    _write(root, "models/llm/good.yaml", yaml.safe_dump(MODEL))
    for product in (GOOD_PRODUCT, OTHER_PRODUCT):
        shutil.copytree(PROFILES / product, root / "profiles" / product)


@pytest.fixture(scope="module")
def baseline():
    """The good tree after one pass (its last good copies written), and what that pass generated."""
    root = Path(tempfile.mkdtemp(prefix="fuzz-baseline-"))
    _good_tree(root)
    output = pass_over(root, processes=1)
    assert not output.errors
    for path, data in output.files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    second = pass_over(root, processes=1)  # the steady state: what a pass over the committed tree renders
    yield root, {path: second.files[path] for path in second.owners[GOOD]}
    shutil.rmtree(root)


# ---------------------------------------------------------------- strategies

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["4Gi", "two", "16 GB", "-1", "1e400", "gpu type", "7b-chat", "a" * 70, "", "x\ny: z",
                              "{{ x }}", "../../etc", "*a", "!!python/name:os.system", GOOD_PRODUCT]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
GARBAGE = st.text(alphabet=st.sampled_from(list(":-{}[]&*!|>'\"%@`#,?\n\t abcXYZ019.")), max_size=120)
NAMES = st.sampled_from(["neighbour", "7b-chat", "Chat", "n.dot", "", "x y", "a" * 70, "good-2", "kai"]) | \
    st.from_regex(r"[a-z0-9][a-z0-9-]{0,12}", fullmatch=True)


def _paths(node, at=()):
    yield at
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*at, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*at, i))


@st.composite
def mutated(draw, base: dict, keep: tuple = ()):
    """`base` with a few paths set to generated values, deleted, or given unknown keys; the path `keep` and
    its ancestors are never touched."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        paths = [p for p in _paths(doc) if p and keep[:len(p)] != p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["set", "delete", "extra"]))
        if action == "set":
            parent[path[-1]] = draw(VALUES)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(VALUES)
    return doc


def _dump(doc) -> str:
    return yaml.safe_dump(doc, allow_unicode=True)


def _texts(documents):
    """A file's text: dumped documents (one or several) or garbage."""
    return st.one_of(GARBAGE, documents.map(_dump),
                     st.lists(documents, min_size=2, max_size=3).map(lambda docs: yaml.safe_dump_all(docs)))


def _neighbour(name: str, product: str, composition: str) -> dict:
    doc = copy.deepcopy(MODEL)
    doc["metadata"]["name"] = name
    doc["spec"]["gpu"]["product"] = product
    doc["spec"]["compositionRef"] = {"name": composition}
    return doc


NEIGHBOURS = st.builds(_neighbour, NAMES.filter(lambda n: n != "good"),
                       st.sampled_from([OTHER_PRODUCT, "Tesla-T4", "NVIDIA-H100", "nvidia l4"]),
                       st.sampled_from(["default", "hami", "kai", "fuzz-a", "fuzz-b", "missing"])).flatmap(
    lambda doc: mutated(doc, keep=("spec", "gpu", "product")))  # a model without a product may take the H200
COMPOSITIONS = st.builds(lambda name, params: {**COMPOSITION, "metadata": {"name": name},
                                               "spec": {**COMPOSITION["spec"], "parameters": params}},
                         st.sampled_from(["fuzz-a", "fuzz-b", "Fuzz", "hami"]),
                         st.dictionaries(st.sampled_from(["workerCpu", "profilerCpu", "profilerMemory", "tolerations",
                                                          "nodeSelector", "kaiQueue", "image", "workerNamespace",
                                                          "modelCache", "httpPort", "unknown"]),
                                         VALUES, max_size=3)).flatmap(mutated)
PROFILE_DOCS = mutated(PROFILE).filter(lambda doc: GOOD_PRODUCT not in yaml.safe_dump(doc))
RECORDS = st.builds(lambda name: {**RECORD, "model": {"namespace": "llm", "name": name}},
                    NAMES.filter(lambda n: n != "good")).flatmap(mutated)
EXTRA_NODES = st.lists(st.builds(lambda name, product, count: {"name": name, "product": product,
                                                               "memory": "23034Mi", "count": count},
                                 NAMES.filter(lambda n: n != "good-node"), st.sampled_from([OTHER_PRODUCT, "X"]),
                                 VALUES), max_size=2)


@st.composite
def hostile_files(draw):
    """Repository path -> text of the generated files (gpus.yaml included when it is broken or extended)."""
    files = {}
    for i, text in enumerate(draw(st.lists(_texts(NEIGHBOURS), max_size=3))):
        files[f"models/fuzz/m{i}.yaml"] = text
    for i, text in enumerate(draw(st.lists(_texts(COMPOSITIONS), max_size=2))):
        files[f"compositions/fuzz-{i}.yaml"] = text
    for i, text in enumerate(draw(st.lists(_texts(PROFILE_DOCS), max_size=2))):
        files[f"profiles/fuzz/p{i}.yaml"] = text
    for i, text in enumerate(draw(st.lists(_texts(RECORDS), max_size=2))):
        files[f"decisions/rightsizing/llm/{draw(st.sampled_from(['neighbour', 'r' + str(i), 'good']))}.yaml"] = text
    inventory = draw(st.sampled_from(["kept", "garbage", "broken", "extended"]))
    if inventory == "garbage":
        files["gpus.yaml"] = draw(GARBAGE)
    elif inventory == "broken":  # a required field of the good node of the wrong type: the whole file is refused
        broken = copy.deepcopy(INVENTORY)
        broken["nodes"][0]["count"] = draw(st.sampled_from(["one", -1, None, [1], 1.5]))
        files["gpus.yaml"] = _dump(broken)
    elif inventory == "extended":
        extended = copy.deepcopy(INVENTORY)
        extended["nodes"] += draw(EXTRA_NODES)
        files["gpus.yaml"] = _dump(extended)
    return files


# ---------------------------------------------------------------- the properties

@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
@given(files=hostile_files())
def test_the_pass_never_crashes_and_never_loses_a_good_model(baseline, files):
    root, good_files = baseline
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        tree = Path(tmp) / "repo"
        shutil.copytree(root, tree)
        for rel, text in files.items():
            _write(tree, rel, text)

        output = pass_over(tree, processes=1)

        for error in output.errors:
            assert PASCAL.match(error.reason), f"{error.reason!r} is not a PascalCase reason"
            assert error.message
        changed = sorted(path for path in good_files if output.files.get(path) != good_files[path])
        assert not changed, _explain(changed, good_files, output.files, files)
        assert set(output.owners.get(GOOD, ())) == set(good_files)


def _explain(changed, before, after, files) -> str:
    """What changed in the good model's files, and the generated files beside it (for a failing example)."""
    diff = "".join(difflib.unified_diff((before[changed[0]] or b"").decode().splitlines(True),
                                        (after.get(changed[0]) or b"").decode().splitlines(True), changed[0], "now"))
    return f"the good model's {changed} changed:\n{diff[:3000]}\nbeside:\n{repr(files)[:3000]}"
