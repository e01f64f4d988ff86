"""The hardening rules one at a time: the prune guard, a failed render keeping its objects, loops that
outlive any exception, messages that tell the truth, profiles checked against architectures, quantities,
and validate refusing exactly what a reconcile pass refuses."""
from __future__ import annotations

import importlib.util
import io
import re
import shutil
from pathlib import Path

import pytest
import yaml

from contract.estimate import PUBLISHED_CONFIGS
from contract.quantity import QuantityError, parse_bytes
from controller.cli.cluster_loop import ClusterReconciler
from controller.cli.commands import main
from controller.cli.common import show
from controller.cli.offline import OfflineResult, pass_over
from controller.cli.reconcile_cmd import poll
from controller.inputs.layout import OWNERS_FILE
from controller.inputs.load import parse_profile
from controller.inputs.reader import read_owners
from controller.passes.reconcile import dump_owners, guarded_change, kept_owners, prune_hold
from controller.rendering.compose import Rendered
from controller.rendering.compose_errors import MixedCompositions
from gitops import Change, PublishResult, publish
from gitops.git import PushOutcome

FLEET = Path(__file__).resolve().parent.parent / "examples" / "fleet"
PROFILES = FLEET / "profiles" / "NVIDIA-H200"
OBJECTS = [f"rendered/ns/configmap-w{i}.yaml" for i in range(10)]


# ---------------------------------------------------------------- the prune guard

@pytest.mark.parametrize("after, share, held", [
    pytest.param(OBJECTS, 0.5, False, id="nothing-removed"),
    pytest.param(OBJECTS[:5], 0.5, False, id="half-removed-is-allowed"),
    pytest.param(OBJECTS[:4], 0.5, True, id="more-than-half-removed-is-held"),
    pytest.param([], 0.5, True, id="everything-removed-is-held"),
    pytest.param([], 1.0, False, id="share-1-turns-the-guard-off"),
    pytest.param(OBJECTS[:9], 0.0, True, id="share-0-holds-any-removal"),
    pytest.param([f"rendered/ns/job-{i}.yaml" for i in range(10)], 0.5, False, id="replaced-objects-are-no-removal"),
    pytest.param(OBJECTS[:1] + ["rendered/PLAN.md"] * 9, 0.5, True, id="plan-md-is-no-object"),
])
def test_prune_hold(after, share, held):
    assert (prune_hold([*OBJECTS, "rendered/PLAN.md", "decisions/a/b.yaml"], after, share) is not None) == held


def test_a_held_change_keeps_every_owned_file_and_commits_nothing():
    before = [*OBJECTS, "decisions/ns/m.yaml"]
    guarded = guarded_change(before, {"rendered/PLAN.md": b"x"}, 0.5)
    assert guarded.hold is not None and guarded.files == {} and guarded.keep == frozenset(before)
    assert "from 10 to 0" in guarded.hold.message and "--max-prune-share 1" in guarded.hold.fix
    guarded = guarded_change(before, {p: b"x" for p in OBJECTS[:4]}, 0.5, keep=frozenset(OBJECTS[4:]))
    assert guarded.hold is None  # kept objects are not removed


# ---------------------------------------------------------------- a model that fails to render keeps its objects

def test_a_model_that_fails_to_render_keeps_what_the_last_pass_generated():
    rendered = Rendered(files={"rendered/ns/service-b.yaml": "b"}, errors=(MixedCompositions("llm/a", "m", "f"),),
                        owners={"rendered/ns/service-b.yaml": ("llm/b",)}, changes=())
    before = {"llm/a": ("rendered/ns/service-a.yaml", "decisions/llm/a.yaml", "../../etc/passwd", "models/a.yaml",
                        "rendered/../gpus.yaml"),
              "llm/gone": ("rendered/ns/service-gone.yaml",)}

    owners, keep = kept_owners(rendered, before)

    assert keep == {"rendered/ns/service-a.yaml", "decisions/llm/a.yaml"}  # unsafe paths from git are dropped
    assert owners == {"llm/a": ("decisions/llm/a.yaml", "rendered/ns/service-a.yaml"),
                      "llm/b": ("rendered/ns/service-b.yaml",)}  # a deleted model is not kept


# ---------------------------------------------------------------- loops outlive any exception

def _published(branch="main", upstream="a" * 40, heads=None, commit=None):
    return PublishResult(commit, 1, "no change", branch, upstream, heads or {branch: upstream})


def test_the_offline_loop_survives_an_unexpected_exception_and_backs_off(capsys, caplog):
    calls, waits = [], []

    def one_pass(previous):
        calls.append(previous)
        if len(calls) == 1:
            raise TypeError("unhashable type: 'list'")
        return OfflineResult(_published(), None)

    assert poll(one_pass, 10.0, sleep=waits.append, passes=3) == 0
    assert len(calls) == 3 and calls[1] is None  # the pass after a crash renders again
    err = capsys.readouterr().err
    assert "[PassCrashed]" in err and "TypeError" in err
    assert any(r.getMessage().startswith("retrying in") for r in caplog.records)  # logged, whatever the handlers
    assert 0 < waits[0] <= 10.0  # the backoff after the first failure


class _Leader:
    is_leader = True

    def try_acquire_or_renew(self):
        return True

    def release(self):
        pass


class _BrokenCluster:
    def nodes(self):
        raise TypeError("a node label nobody foresaw")


def test_the_cluster_loop_reports_an_unexpected_exception_and_keeps_going():
    reconciler = ClusterReconciler(_BrokenCluster(), None, _Leader(), sleep=lambda s: None,
                                   jitter=lambda a, b: a)
    report = reconciler.reconcile_once()
    assert [reason for reason, _ in report.errors] == ["PassCrashed"]
    assert "TypeError" in report.errors[0][1]
    assert reconciler.run(1.0, passes=3) == 1  # three passes ran; none raised


# ---------------------------------------------------------------- messages that tell the truth

def test_a_review_branch_no_op_names_the_review_branch_head():
    out = io.StringIO()
    result = _published("gpushare/plan", "a" * 40, {"main": "a" * 40, "gpushare/plan": "b" * 40})
    show(OfflineResult(result, None), out)
    assert f"no change (gpushare/plan at {'b' * 12}; main at {'a' * 12})" in out.getvalue()


class _FakeCopy:
    """The WorkingCopy calls publish makes, for a push whose commit the remote already holds."""

    branch, root, object_format = "main", Path("/nonexistent"), "sha1"

    def in_pass(self, action):
        return action()

    def fetch(self, *also):
        return {"main": "1" * 40}

    def checkout(self, revision):
        pass

    def entries(self, revision, owned):
        return {}

    def write_tree(self, upstream, edit):
        return "t" * 40

    def tree_of(self, revision):
        return "0" * 40

    def is_ancestor(self, a, b):
        return True

    def commit_tree(self, tree, parents, message):
        return "c" * 40

    def push(self, commit, branch, new_files=0):
        return PushOutcome("present", "[up to date]")


def test_a_commit_another_controller_already_pushed_is_not_reported_as_committed():
    result = publish(_FakeCopy(), lambda checkout: Change({"rendered/x.yaml": b"x"}, "msg"), owned=("rendered/",))
    assert not result.changed and result.heads["main"] == "c" * 40


def _materialize(root: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)


def test_a_budget_only_change_says_what_changed(tmp_path):
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    _materialize(root, pass_over(root, processes=1).files)
    chat = root / "models" / "llm" / "chat.yaml"
    chat.write_text(chat.read_text().replace("memoryBudget: 6Gi", "memoryBudget: 7Gi"))

    out = pass_over(root, processes=1)

    assert out.rendered.changes == ()  # no decision moved
    assert out.message.splitlines()[0] == ("gpushare: re-render llm/summarizer: memoryBudget 6.0Gi → 7.0Gi "
                                           "(no decision moved)")


# ---------------------------------------------------------------- a profile checked against its architecture

def _profile(name: str) -> dict:
    return yaml.safe_load((PROFILES / name).read_text())


def _scaled(doc: dict, factor: float) -> dict:
    weights = doc["weights"]
    weights["layerBytes"] = [int(b * factor) for b in weights["layerBytes"]]
    for key in ("embeddingBytes", "finalNormBytes", "headBytes"):
        weights[key] = int(weights[key] * factor)
    weights["totalBytes"] = (weights["embeddingBytes"] + sum(weights["layerBytes"]) + weights["finalNormBytes"]
                             + weights["headBytes"])
    return doc


@pytest.mark.parametrize("factor, refused", [
    pytest.param(1.0, False, id="as-estimated"), pytest.param(1.2, False, id="20pct-more-within-tolerance"),
    pytest.param(0.8, False, id="20pct-less-within-tolerance"), pytest.param(1.3, True, id="30pct-more"),
    pytest.param(0.5, True, id="half"), pytest.param(0.0, True, id="zero-bytes"),
])
def test_a_profile_of_a_known_model_must_agree_with_its_architecture(factor, refused):
    doc = _scaled(_profile("meta-llama--llama-3.1-70b-instruct.yaml"), factor)
    profile, errors = parse_profile(doc, "profiles/x.yaml")
    assert (profile is None) == refused
    if refused:
        assert [e.reason for e in errors] == ["ProfileDisagreesWithArchitecture"]
        assert "weights.totalBytes" in errors[0].message and "25%" in errors[0].message
        (command,) = re.findall(r"python -m ([\w.]+)", errors[0].fix)
        assert importlib.util.find_spec(command) is not None, f"the fix names {command}, which does not exist"


def test_a_profile_of_an_unknown_model_is_checked_against_its_own_architecture_block():
    doc = _scaled(_profile("meta-llama--llama-3.1-70b-instruct.yaml"), 0.0)
    doc["model"] = "example/private-model"
    assert "example/private-model" not in PUBLISHED_CONFIGS
    (error,) = parse_profile(doc, "profiles/x.yaml")[1]
    assert error.reason == "ProfileDisagreesWithArchitecture" and "architecture block" in error.message
    del doc["architecture"]
    assert parse_profile(doc, "profiles/x.yaml")[1] == []  # nothing to check against: taken as written


# ---------------------------------------------------------------- quantities

@pytest.mark.parametrize("value, problem", [
    pytest.param("4Gi ", "leading or trailing whitespace", id="trailing-space"),
    pytest.param("\t4Gi", "leading or trailing whitespace", id="leading-tab"),
    pytest.param("8Ei", "largest quantity", id="8Ei-is-one-byte-too-many"),
    pytest.param("1e30", "largest quantity", id="exponent"),
    pytest.param("1e999999999", "largest quantity", id="exponent-beyond-decimal"),
    pytest.param(2**63, "largest quantity", id="int-beyond-int64"),
    pytest.param("4 Gi", "not a Kubernetes quantity", id="inner-space"),
])
def test_quantities_are_refused_with_the_real_reason(value, problem):
    with pytest.raises(QuantityError, match=problem):
        parse_bytes(value)


def test_the_largest_quantity_is_int64():
    assert parse_bytes(2**63 - 1) == 2**63 - 1 and parse_bytes("7Ei") == 7 * 2**60


# ---------------------------------------------------------------- validate refuses what reconcile refuses

def _edit(path: str, old: str, new: str):
    def apply(root: Path) -> None:
        target = root / path
        target.write_text(target.read_text().replace(old, new))
    return apply


@pytest.mark.parametrize("edit, reason", [
    pytest.param(_edit("models/llm/chat.yaml", "product: NVIDIA-L4", "product: NVIDIA-L4\n  compositionRef:\n"
                       "    name: nobody"), "UnknownComposition", id="unknown-composition-ref"),
    pytest.param(_edit("gpus.yaml", "count: 1", "count: .nan"), "InvalidNumber", id="nan-in-gpus"),
])
def test_validate_reports_every_error_a_reconcile_pass_reports(edit, reason, tmp_path, capsys):
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    edit(root)

    out = pass_over(root, processes=1)
    code = main(["validate", str(root)])
    printed = capsys.readouterr().out

    pass_reasons = {e.reason for e in out.errors}
    assert reason in pass_reasons and code == 1
    assert all(f"[{r}]" in printed for r in pass_reasons)


def test_two_compositions_on_one_gpu_are_a_plan_refusal_that_validate_and_the_pass_agree_on(tmp_path, capsys):
    """The planner knows the renderer's one-composition-per-GPU rule: the model is refused in the plan with
    MixedCompositions and the fix, so neither the pass nor validate has a render error left to report."""
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    _edit("models/llm/chat.yaml", "product: NVIDIA-H200", "product: NVIDIA-L4\n  compositionRef:\n"
          "    name: hami")(root)
    out = pass_over(root, processes=1)
    assert main(["validate", str(root)]) == 0 and out.errors == ()
    decision = next(d for d in out.plan.decisions if d.name == "chat-small")
    assert (decision.mode, decision.reason_code) == ("refused", "MixedCompositions")
    assert main(["plan", str(root)]) == 0
    assert "set spec.compositionRef.name to 'default'" in capsys.readouterr().out


def test_a_model_whose_composition_is_deleted_keeps_its_objects(tmp_path):
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    (root / "compositions").mkdir()
    (root / "compositions" / "team.yaml").write_text(
        (Path(__file__).resolve().parent / "fixtures" / "load" / "compositions" / "vllm-like.yaml").read_text()
        .replace("name: vllm-like", "name: team"))
    chat = root / "models" / "llm" / "chat.yaml"
    chat.write_text(chat.read_text().replace("product: NVIDIA-L4", "product: NVIDIA-L4\n  compositionRef: {name: team}"))
    first = pass_over(root, processes=1)
    assert not first.errors
    _materialize(root, first.files)
    theirs = first.owners["llm/summarizer"]
    assert any(path.startswith("rendered/llm-workers/") for path in theirs)  # the team's worker namespace

    (root / "compositions" / "team.yaml").unlink()
    second = pass_over(root, processes=1)

    found = {(e.reason, getattr(e, "object", None) or getattr(e, "ref", None)) for e in second.errors}
    assert ("UnknownComposition", "llm/summarizer") in found  # the input error, and the revived spec's render
    assert set(theirs) <= second.keep and second.owners["llm/summarizer"] == theirs


@pytest.mark.parametrize("entries, read", [
    pytest.param(40, True, id="owners-file-larger-than-one-input-file-is-still-read"),
    pytest.param(400, False, id="owners-file-beyond-the-state-limit-is-refused-and-said"),
])
def test_the_owners_file_grows_with_the_fleet_up_to_the_state_limit(tmp_path, monkeypatch, caplog, entries, read):
    """The owners file is the controller's own and grows with the fleet: it is read with max_state_bytes
    (STATE_FACTOR input files), not the limit of one user file, and a refusal is logged, not silent."""
    monkeypatch.setenv("GPUSHARE_MAX_INPUT_BYTES", "1000")
    owners = {f"team/model-{i:04d}": (f"decisions/team/model-{i:04d}.yaml", f"rendered/team/service-m{i:04d}.yaml")
              for i in range(entries)}
    path = tmp_path / OWNERS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(dump_owners(owners))
    assert 1000 < path.stat().st_size and (path.stat().st_size <= 16_000) == read
    with caplog.at_level("WARNING", logger="gpushare.inputs"):
        got = read_owners(tmp_path)
    assert got == (owners if read else {})
    assert any(OWNERS_FILE in r.getMessage() for r in caplog.records) == (not read)


@pytest.mark.parametrize("text, expected", [
    pytest.param(None, {"llm/chat": ("decisions/llm/chat.yaml", "rendered/llm/service-chat.yaml")},
                 id="json-as-the-controller-writes-it-now"),
    pytest.param("# an older controller wrote YAML\nllm/chat:\n- decisions/llm/chat.yaml\n",
                 {"llm/chat": ("decisions/llm/chat.yaml",)}, id="yaml-an-older-controller-wrote-is-still-read"),
    pytest.param('{"llm/chat": ["decisions/llm/chat.yaml", 7], "odd": "x", "7": [1]}',
                 {"llm/chat": ("decisions/llm/chat.yaml",), "7": ()}, id="values-not-strings-are-dropped"),
    pytest.param("[" * 5000 + "]" * 5000, {}, id="deeply-nested-json-is-refused-not-a-crash"),
])
def test_the_owners_file_is_json_and_still_reads_yaml(tmp_path, text, expected):
    path = tmp_path / OWNERS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(dump_owners(expected) if text is None else text)
    assert read_owners(tmp_path) == expected
