"""controller.inputs.placement_probe: each document's spec.placement found without reading the file, or no answer.

Table-driven: the layouts it reads (the entry it hands back must read as the document's spec.placement), and
every construct that makes it answer None (the reader then reads the file in full). A differential fuzz holds it
to the real reader: for any text (YAML dumped in many styles, then mutated line by line) where it gives an
answer and the reader reads every document, each document's spec.placement is what the entry it found reads as.
"""
from __future__ import annotations

import string

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from controller.inputs.load import load_documents
from controller.inputs.placement_probe import placement_blocks
from controller.inputs.yamlin import parse_documents

HEAD = "apiVersion: gpushare.dev/v1alpha1\nkind: ElasticModel\nmetadata:\n  name: m\n  namespace: llm\n"
SPEC = "spec:\n  model: Qwen/Qwen2.5-0.5B-Instruct\n  memoryBudget: 4Gi\n"


def _read(block: str) -> object:
    (found,) = parse_documents(block, unique_keys=True)
    return found["placement"]


READ = [  # (case, text, the placement of each document; None: the document has none)
    ("block-sequence", HEAD + SPEC + "  placement:\n    clusters:\n    - eu-1\n", [{"clusters": ["eu-1"]}]),
    ("flow-sequence-and-comments", HEAD + SPEC + "  placement:  # where\n    clusters: [eu-1, \"us-1\"]  # both\n"
     "\n    # nothing\n", [{"clusters": ["eu-1", "us-1"]}]),
    ("placement-first-then-more-keys", HEAD + "spec:\n  placement:\n    clusterSelector:\n      matchLabels:\n"
     "        env: prod\n  model: m\n  memoryBudget: 4Gi\n", [{"clusterSelector": {"matchLabels": {"env": "prod"}}}]),
    ("four-space-indent", HEAD + "spec:\n    model: m\n    placement:\n        clusters:\n        - us-1\n",
     [{"clusters": ["us-1"]}]),
    ("no-placement", HEAD + SPEC, [None]),
    ("placement-under-metadata-is-not-specs", "metadata:\n  placement:\n    clusters: [eu-1]\n" + SPEC, [None]),
    ("placement-of-a-nested-key-is-not-specs", HEAD + SPEC + "  slo:\n    placement:\n      clusters: [eu-1]\n",
     [None]),
    ("spec-before-other-top-level-keys", "spec:\n  placement:\n    clusters: [eu-1]\nkind: ElasticModel\n",
     [{"clusters": ["eu-1"]}]),
    ("documents-and-empty-ones", "---\n" + HEAD + SPEC + "---\n# only a comment\n---\n" + HEAD + SPEC
     + "  placement:\n    clusters: [staging]\n", [None, {"clusters": ["staging"]}]),
    ("empty-flow-mapping-elsewhere", HEAD + SPEC + "  slo: {}\n  placement:\n    clusters: [eu-1]\n",
     [{"clusters": ["eu-1"]}]),
    ("inline-null-placement", HEAD + SPEC + "  placement: null\n", [None]),
]


@pytest.mark.parametrize("text, placements", [c[1:] for c in READ], ids=[c[0] for c in READ])
def test_the_placement_of_each_document_is_found_where_block_yaml_puts_it(text, placements):
    blocks = placement_blocks(text)
    assert blocks is not None
    assert [_read(block) if block else None for block in blocks] == placements
    docs, errors = load_documents(text, "models/x.yaml")
    assert not errors
    assert [(doc.get("spec") or {}).get("placement") for _, doc in docs] == placements, "as the reader reads it"


PLACED = HEAD + SPEC + "  placement:\n    clusters: [eu-1]\n"
UNSURE = [  # (case, text): each makes the probe answer None
    ("tab", PLACED.replace("  model", "\tmodel")),
    ("carriage-return", PLACED.replace("\n", "\r\n")),
    ("literal-block", PLACED + "  notes: |\n    placement:\n"),
    ("folded-block", PLACED + "  notes: >\n    text\n"),
    ("anchor", PLACED.replace("spec:", "spec: &s")),
    ("alias", HEAD + "spec: *s\n"),
    ("merge-key-with-alias", HEAD + SPEC + "  <<: *base\n"),
    ("tag", PLACED.replace("4Gi", "!!str 4Gi")),
    ("complex-key", PLACED + "? placement\n: x\n"),
    ("directive", "%YAML 1.1\n---\n" + PLACED),
    ("document-end", PLACED + "...\n" + PLACED),
    ("marker-with-content", PLACED + "--- placement\n"),
    ("flow-mapping", HEAD + "spec: {placement: {clusters: [eu-1]}}\n"),
    ("flow-mapping-of-placement", HEAD + SPEC + "  placement: {clusters: [eu-1]}\n"),
    ("unclosed-double-quote", PLACED.replace("4Gi", '"4Gi')),
    ("unclosed-single-quote", PLACED.replace("4Gi", "'4\n  Gi'")),
    ("unclosed-flow-sequence", HEAD + SPEC + "  placement:\n    clusters: [eu-1,\n      us-1]\n"),
    ("quoted-key", PLACED.replace("  model:", '  "model":')),
    ("escaped-quote", PLACED.replace("4Gi", '"4\\"Gi"')),
    ("indented-document", "".join("  " + line + "\n" for line in PLACED.splitlines())),
    ("root-sequence", "- " + PLACED.replace("\n", "\n  ")),
    ("two-specs", PLACED + "spec:\n  model: other\n"),
    ("a-scalar-spec-before-the-block-one", HEAD + "spec: ''\n" + PLACED[len(HEAD):]),
    ("repeated-placement", PLACED + "  placement:\n    clusters: [us-1]\n"),
    ("flow-spec", HEAD + "spec: {}\n"),
    ("spec-without-a-block-mapping", HEAD + "spec:\n- placement\n"),
    ("placement-glued-to-its-value", HEAD + SPEC + "  placement:x\n"),
    ("no-spec", HEAD),
    ("unclosed-flow-with-a-run-of-spaces", HEAD + "spec:\n  k: [a" + " " * 20000 + ",\n"),  # read in linear time
]


@pytest.mark.parametrize("text", [c[1] for c in UNSURE], ids=[c[0] for c in UNSURE])
def test_anything_beyond_plain_block_yaml_gets_no_answer(text):
    assert placement_blocks(text) is None


# ---------------------------------------------------------------- differential fuzz against the real reader

NAMES = st.sampled_from(["eu-1", "us-1", "staging", "c-00", "yes", "1", "null", "a b", "x:y", "#c", "'q'", '"d"'])
PLAIN_WORDS = st.text(alphabet=string.ascii_letters + string.digits + " -_./", max_size=40)
WORDS = st.one_of(*[PLAIN_WORDS] * 6, st.text(
    alphabet=string.ascii_letters + string.digits + " -_:#'\"[]{},&*!|>%@`?.\n\t\\", max_size=30))
PLACEMENTS = st.one_of(
    st.fixed_dictionaries({"clusters": st.lists(NAMES, max_size=3)}),
    st.fixed_dictionaries({"clusterSelector": st.fixed_dictionaries({"matchLabels": st.dictionaries(
        st.sampled_from(["env", "region"]), NAMES, max_size=2)})}),
    st.dictionaries(st.sampled_from(["clusters", "placement", "spec", "clusterSelector"]),
                    st.one_of(NAMES, st.lists(NAMES, max_size=2), st.none()), max_size=2),
    st.none(), NAMES,
)
SPECS = st.fixed_dictionaries(
    {"model": WORDS, "memoryBudget": WORDS, "placement": PLACEMENTS},
    optional={"slo": st.dictionaries(st.sampled_from(["placement", "spec", "x"]), st.one_of(WORDS, PLACEMENTS),
                                     max_size=2),
              "servedNames": st.lists(WORDS, max_size=3), "notes": WORDS})
DOCS = st.fixed_dictionaries(
    {"kind": st.just("ElasticModel"), "spec": st.one_of(*[SPECS] * 4, st.none(), WORDS)},
    optional={"metadata": st.dictionaries(st.sampled_from(["name", "placement", "spec"]),
                                          st.one_of(WORDS, PLACEMENTS), max_size=2),
              "placement": PLACEMENTS, "status": st.dictionaries(st.just("placement"), PLACEMENTS, max_size=1)})
STYLES = st.fixed_dictionaries({"indent": st.integers(2, 5), "width": st.sampled_from([12, 40, 200]),
                                "default_flow_style": st.sampled_from([False] * 4 + [None, True]),
                                "sort_keys": st.booleans(), "explicit_start": st.booleans()})
EDITS = st.lists(st.tuples(st.integers(0, 60), st.sampled_from(
    ["comment", "blank", "indent+1", "indent-1", "indent+2", "marker", "dash", "drop"])), max_size=4)


def _edited(text: str, edits: list[tuple[int, str]]) -> str:
    lines = text.split("\n")
    for at, edit in edits:
        i = at % max(len(lines), 1)
        line = lines[i] if lines else ""
        pad = len(line) - len(line.lstrip(" "))
        lines[i:i + 1] = {
            "comment": [" " * pad + "# placement: x", line], "blank": ["", line], "indent+1": [" " + line],
            "indent-1": [line[1:] if pad else line], "indent+2": ["  " + line], "marker": ["---", line],
            "dash": [" " * pad + "- " + line.lstrip(" ")], "drop": []}[edit]
    return "\n".join(lines)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(DOCS, min_size=1, max_size=3), STYLES, EDITS)
def test_where_it_answers_each_documents_placement_is_what_the_reader_reads(docs, style, edits):
    text = _edited(yaml.safe_dump_all(docs, **style), edits)
    blocks = placement_blocks(text)
    if blocks is None:
        return
    read, errors = load_documents(text, "models/x.yaml")
    if errors:
        return  # a text the reader refuses is its own clusters' error to report: no placement to compare
    assert len(blocks) == len(read)
    for block, (_, doc) in zip(blocks, read):
        spec = doc.get("spec") if isinstance(doc, dict) else None
        if block:
            assert isinstance(spec, dict) and _read(block) == spec.get("placement"), (text, block)
        else:
            assert not (isinstance(spec, dict) and "placement" in spec) or "<<" in text, (text, block)


LABEL = st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True).filter(
    lambda name: name not in {"y", "n", "yes", "no", "on", "off", "true", "false", "null"})
PLAIN_PLACEMENTS = st.one_of(
    st.fixed_dictionaries({"clusters": st.lists(LABEL, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"clusterSelector": st.fixed_dictionaries({"matchLabels": st.dictionaries(
        st.sampled_from(["env", "region"]), LABEL, min_size=1, max_size=2)})}))
PLAIN_DOCS = st.fixed_dictionaries(
    {"apiVersion": st.just("gpushare.dev/v1alpha1"), "kind": st.just("ElasticModel"),
     "metadata": st.fixed_dictionaries({"name": LABEL, "namespace": LABEL}),
     "spec": st.fixed_dictionaries({"model": PLAIN_WORDS.filter(str.strip), "memoryBudget": st.just("4Gi")},
                                   optional={"placement": PLAIN_PLACEMENTS,
                                             "servedNames": st.lists(LABEL, max_size=2)})})


@settings(max_examples=300, deadline=None)
@given(st.lists(PLAIN_DOCS, min_size=1, max_size=4), st.integers(2, 4), st.booleans(), st.booleans())
def test_plain_block_yaml_as_tools_write_it_is_answered_and_read_alike(docs, indent, sort_keys, explicit_start):
    text = yaml.safe_dump_all(docs, indent=indent, sort_keys=sort_keys, explicit_start=explicit_start,
                              default_flow_style=False)
    blocks = placement_blocks(text)
    assert blocks is not None, text
    assert [_read(block) if block else None for block in blocks] == [d["spec"].get("placement") for d in docs]
