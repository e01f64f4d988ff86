"""Hostile inputs: every file under tests/fixtures/hostile/<kind>/ is named `<ExpectedReason>--<what>.yaml`.

Each one is dropped into a copy of the example fleet where a user would put it (a model file, a
profile, gpus.yaml, a repository composition) and read the way every command reads a repository
(controller.inputs.reader.read_repo, which validate, plan, explain and reconcile share). The
expected outcome is one per-file error with that reason, the rest of the fleet still read, no
exception, no file content in any message beyond the offending token, and strict JSON from
`plan -o json`. Symlinks, FIFOs and oversized files are built in the test (git fixtures cannot
hold them portably).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.cli.commands import main
from controller.inputs.reader import read_repo
from controller.inputs.yamlin import YamlLimits, parse_documents

FLEET = Path(__file__).resolve().parent.parent / "examples" / "fleet"
HOSTILE = Path(__file__).resolve().parent / "fixtures" / "hostile"
SECRET = "ghp_secretTokenThatMustNeverBePrinted"
WHERE = {"models": "models/hostile.yaml", "profiles": "profiles/NVIDIA-H200/hostile.yaml", "gpus": "gpus.yaml",
         "compositions": "compositions/hostile.yaml"}
CASES = [pytest.param(kind, path, id=f"{kind}/{path.stem}")
         for kind in sorted(WHERE) for path in sorted((HOSTILE / kind).glob("*.yaml"))]


def fleet_copy(root: Path) -> Path:
    shutil.copytree(FLEET, root, ignore=shutil.ignore_patterns("rendered", "decisions"))
    return root


def no_secret(snapshot) -> None:
    for error in snapshot.inputs.errors:
        assert SECRET not in f"{error.message} {error.fix}", error


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    inputs = read_repo(fleet_copy(tmp_path_factory.mktemp("base") / "fleet")).inputs
    assert inputs.errors == ()
    return inputs


def test_every_kind_has_hostile_fixtures():
    assert all(len(list((HOSTILE / kind).glob("*.yaml"))) >= 5 for kind in WHERE)


@pytest.mark.parametrize("kind, fixture", CASES)
def test_a_hostile_file_is_one_per_file_error_and_the_rest_still_loads(kind, fixture, tmp_path, baseline):
    root = fleet_copy(tmp_path / "fleet")
    place = WHERE[kind]
    (root / place).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(fixture, root / place)

    snapshot = read_repo(root)

    expected = fixture.name.split("--")[0]
    found = [e for e in snapshot.inputs.errors if e.file == place]
    assert expected in [e.reason for e in found], [(e.reason, e.path, e.message) for e in found]
    assert all(e.file == place for e in snapshot.inputs.errors), "errors leaked into other files"
    no_secret(snapshot)
    if kind != "models":  # the user's models are untouched by a bad profile, inventory or composition
        assert {m.key for m in snapshot.inputs.models} == {m.key for m in baseline.models}
    if kind != "gpus":
        assert snapshot.inputs.slots == baseline.slots
    if kind != "profiles":
        assert set(snapshot.inputs.profiles) == set(baseline.profiles)


NUMBERS_AND_CROSS_CHECKS = ("InvalidNumber", "InvalidQuantity", "ProfileDisagreesWithArchitecture",
                            "UnknownComposition", "NotAnObject")


@pytest.mark.parametrize("kind, fixture", [c for c in CASES if c.values[0] in ("models", "profiles")
                                           and c.values[1].name.split("--")[0] in NUMBERS_AND_CROSS_CHECKS])
def test_validate_exits_1_and_plan_json_stays_strict(kind, fixture, tmp_path, capsys):
    root = fleet_copy(tmp_path / "fleet")
    shutil.copy(fixture, root / WHERE[kind])

    assert main(["validate", str(root)]) == 1
    out = capsys.readouterr().out
    assert fixture.name.split("--")[0] in out and SECRET not in out
    assert main(["plan", str(root), "-o", "json"]) == 1  # input errors: exit 1, the JSON still printed
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"plan -o json printed {name}"))
    assert doc["errors"]


# ---------------------------------------------------------------- the filesystem: never leave the repository

def _outside_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "token"
    secret.parent.mkdir()
    secret.write_text(f"{SECRET}-from-outside\n")
    return secret


def _link_file(root: Path, rel: str, target: Path) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    if (root / rel).exists() or (root / rel).is_symlink():
        (root / rel).unlink()
    (root / rel).symlink_to(target)


SYMLINKS = [
    pytest.param("models/token.yaml", "UnsafePath", id="model-file-to-a-token"),
    pytest.param("profiles/NVIDIA-H200/token.yaml", "UnsafePath", id="profile-file-to-a-token"),
    pytest.param("gpus.yaml", "UnsafePath", id="inventory-to-a-token"),
    pytest.param("compositions/token.yaml", "UnsafePath", id="composition-to-a-token"),
]


@pytest.mark.parametrize("rel, reason", SYMLINKS)
def test_a_symlink_out_of_the_repository_is_refused_without_its_content(rel, reason, tmp_path, capsys):
    root = fleet_copy(tmp_path / "fleet")
    _link_file(root, rel, _outside_secret(tmp_path))

    snapshot = read_repo(root)

    assert [(e.file, e.reason) for e in snapshot.inputs.errors] == [(rel, reason)]
    no_secret(snapshot)
    main(["validate", str(root)])
    assert SECRET not in capsys.readouterr().out


@pytest.mark.parametrize("tree", ["models", "profiles", "compositions"])
def test_a_directory_symlink_out_of_the_repository_is_not_descended(tree, tmp_path):
    root = fleet_copy(tmp_path / "fleet")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "stolen.yaml").write_text(f"{SECRET}\n")
    (root / tree).mkdir(exist_ok=True)
    (root / tree / "linked").symlink_to(outside, target_is_directory=True)

    snapshot = read_repo(root)

    assert [(e.file, e.reason) for e in snapshot.inputs.errors] == [(f"{tree}/linked", "UnsafePath")]
    no_secret(snapshot)


def test_a_whole_input_tree_linked_out_of_the_repository_is_refused(tmp_path):
    root = fleet_copy(tmp_path / "fleet")
    outside = tmp_path / "elsewhere"
    shutil.move(root / "models", outside)
    (root / "models").symlink_to(outside, target_is_directory=True)

    snapshot = read_repo(root)

    assert [(e.file, e.reason) for e in snapshot.inputs.errors] == [("models", "UnsafePath")]
    assert snapshot.inputs.models == ()


def test_a_symlink_inside_the_repository_is_followed(tmp_path):
    root = fleet_copy(tmp_path / "fleet")
    (root / "common").mkdir()
    shutil.move(root / "models" / "research" / "big.yaml", root / "common" / "big.yaml")
    (root / "models" / "research" / "big.yaml").symlink_to(Path("../../common/big.yaml"))

    snapshot = read_repo(root)

    assert snapshot.inputs.errors == ()
    assert any(m.source.file == "models/research/big.yaml" for m in snapshot.inputs.models)


@pytest.mark.parametrize("rel, target", [
    pytest.param("models/config.yaml", "../.git/config", id="model-file-to-git-config"),
    pytest.param("gpus.yaml", ".git/config", id="inventory-to-git-config"),
    pytest.param("models/gitdir", "../.git", id="model-folder-to-the-git-folder"),
    pytest.param("compositions/x.yaml", "../models/../.git/./config", id="a-winding-way-into-git"),
])
def test_a_symlink_into_the_repositorys_git_folder_is_refused_without_its_content(rel, target, tmp_path, capsys):
    """.git holds the remote's URL (a credential may sit in it) and hooks: no commit's input, though inside the
    checkout's directory."""
    root = fleet_copy(tmp_path / "fleet")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text(f"[remote \"origin\"]\n\turl = https://ci:{SECRET}@forge.invalid/x\n")
    (root / ".git" / "x.yaml").write_text(f"{SECRET}: [\n")
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    if (root / rel).exists():
        (root / rel).unlink()
    (root / rel).symlink_to(target)

    snapshot = read_repo(root)

    assert [(e.file, e.reason) for e in snapshot.inputs.errors] == [(rel, "UnsafePath")]
    no_secret(snapshot)
    main(["validate", str(root)])
    assert SECRET not in capsys.readouterr().out


def test_last_good_copies_and_decisions_are_not_read_through_a_symlink(tmp_path):
    root = fleet_copy(tmp_path / "fleet")
    secret = _outside_secret(tmp_path)
    (root / "gpus.yaml").write_text("broken: [")
    _link_file(root, "decisions/_last-good/gpus.yaml", secret)
    _link_file(root, "decisions/llm/chat-small.yaml", secret)
    _link_file(root, "rendered/PLAN.md", secret)

    snapshot = read_repo(root)

    assert snapshot.held == () and snapshot.inputs.slots == () and snapshot.last.records == {}
    assert snapshot.last.plan_md is None


@pytest.mark.parametrize("make, reason", [
    pytest.param(lambda p: os.mkfifo(p), "NotAFile", id="fifo"),
    pytest.param(lambda p: p.symlink_to("/dev/zero"), "UnsafePath", id="link-to-dev-zero"),
    pytest.param(lambda p: p.write_bytes(b"# " + b"x" * (5 << 20)), "FileTooLarge", id="oversized"),
    pytest.param(lambda p: p.write_bytes(b"\xff\xfe" + SECRET.encode()), "UnreadableFile", id="not-utf8"),
])
def test_odd_files_are_per_file_errors_and_never_block(make, reason, tmp_path):
    root = fleet_copy(tmp_path / "fleet")
    make(root / "models" / "odd.yaml")

    snapshot = read_repo(root)

    assert [(e.file, e.reason) for e in snapshot.inputs.errors] == [("models/odd.yaml", reason)]
    no_secret(snapshot)


# ---------------------------------------------------------------- the YAML limits, each with its setting

@pytest.mark.parametrize("text, limits, problem", [
    pytest.param("a: &a [1, 2]\nb: [*a, *a, *a]\n", YamlLimits(max_aliases=2), "alias references",
                 id="aliases"),
    pytest.param("a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nb: [*a, *a]\n", YamlLimits(max_nodes=20), "nodes",
                 id="nodes-after-expansion"),
    pytest.param("a: [[[[1]]]]\n", YamlLimits(max_depth=4), "levels deep", id="depth"),
])
def test_each_yaml_limit_refuses_a_document_beyond_it(text, limits, problem):
    with pytest.raises(Exception, match=problem):
        parse_documents(text, limits=limits)
    assert parse_documents(text, limits=YamlLimits())  # within the defaults


def test_yaml_limits_are_read_from_the_environment():
    limits = YamlLimits.from_env({"GPUSHARE_YAML_MAX_NODES": "10", "GPUSHARE_YAML_MAX_ALIASES": "nonsense"})
    assert (limits.max_nodes, limits.max_aliases, limits.max_depth) == (10, YamlLimits.max_aliases,
                                                                        YamlLimits.max_depth)


# ---------------------------------------------------------------- any shape at all: a per-file error, never a crash

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                     st.datetimes().map(lambda d: d.isoformat()), st.binary(max_size=4))
_KEYS = st.one_of(st.text(max_size=6), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(_KEYS, inner, max_size=3)),
                       max_leaves=12)
_MUTATIONS = ["&a ", "*a", "? ", ": ", "- ", "[", "]", "{", "}", "!!binary ", "!!set ", "!x ", "\t", "<<: *a\n",
              "---\n", ".nan", "1e400", "'", '"', "\n  ", "#", "%YAML 1.1\n"]


def _each_parser(text: str, rel: str) -> None:
    from controller.inputs.load import load_documents, parse_inventory, parse_model, parse_profile
    from controller.inputs.compositions import parse_composition
    from controller.types import Source

    docs, errors = load_documents(text, rel)
    for error in errors:
        assert isinstance(error.message, str) and error.reason
    for index, doc in docs:
        parse_model(doc, Source(rel, index))
        parse_profile(doc, rel, index)
        parse_inventory(doc, rel, index)
        parse_composition(doc, rel, index)


@settings(max_examples=150, deadline=None)
@given(where=st.sampled_from(["spec", "spec.slo", "metadata", "", "spec.memoryBudget", "nodes"]), value=_VALUES)
def test_any_value_anywhere_is_an_error_never_an_exception(where, value):
    doc = yaml.safe_load((FLEET / "models" / "llm" / "chat.yaml").read_text().split("---")[0])
    target = doc
    parts = [p for p in where.split(".") if p]
    for part in parts[:-1]:
        target = target[part]
    if parts:
        target[parts[-1]] = value
    else:
        doc = value
    _each_parser(yaml.safe_dump(doc, allow_unicode=True), "models/fuzz.yaml")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=400), st.sampled_from(_MUTATIONS)), min_size=1,
                max_size=6))
def test_any_mutation_of_a_valid_file_is_an_error_never_an_exception(edits):
    text = (FLEET / "gpus.yaml").read_text() + (FLEET / "models" / "llm" / "chat.yaml").read_text()
    for position, insert in edits:
        position %= len(text)
        text = text[:position] + insert + text[position:]
    _each_parser(text, "models/fuzz.yaml")


def test_anchors_and_merge_keys_within_the_limits_are_read(tmp_path):
    root = fleet_copy(tmp_path / "fleet")
    nodes = "".join(f"  - <<: *h200\n    name: node-{i}\n" for i in range(1, 300))
    (root / "gpus.yaml").write_text("apiVersion: gpushare.dev/v1alpha1\nkind: GPUInventory\nnodes:\n"
                                    "  - &h200 {name: node-0, product: NVIDIA-H200, memory: 143771Mi}\n" + nodes)
    snapshot = read_repo(root)
    assert snapshot.inputs.errors == () and len(snapshot.inputs.slots) == 300
