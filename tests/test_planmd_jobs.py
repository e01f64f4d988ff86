"""PLAN.md's summary counts the profiler Jobs a change CREATES: Job files new against the previous rendered tree (every
one when that tree is unknown), not the Jobs the tree holds. Passes run as the offline shell runs them
(controller.cli.offline.pass_over reads the previous tree from the checkout) over a copy of examples/fleet, whose
research/mistral-7b has no profile and so one profiler Job."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from controller.cli.offline import pass_over
from controller.passes.reconcile import PassOutput
from controller.rendering.planmd import created_jobs, last_change_lines
from tests.conftest import REPO_ROOT

FLEET = REPO_ROOT / "examples" / "fleet"
JOB = "rendered/research/job-profile-mistral-7b-instruct-v0-3-nvidia-h200-5569f790.yaml"

NEW_MODEL = """apiVersion: gpushare.dev/v1alpha1
kind: ElasticModel
metadata:
  name: phi
  namespace: research
spec:
  model: microsoft/Phi-3-mini-4k-instruct
  memoryBudget: 12Gi
  gpu:
    product: NVIDIA-H200
"""


def apply(root: Path) -> PassOutput:
    """One pass over `root`, its generated tree written back into `root` as the commit would leave it."""
    out = pass_over(root, processes=1)
    for sub in ("rendered", "decisions"):
        shutil.rmtree(root / sub, ignore_errors=True)
    for path, data in out.files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return out


def summary(out: PassOutput) -> str:
    return last_change_lines(out.rendered.files["rendered/PLAN.md"]).summary


def _add_model(root: Path) -> None:
    (root / "models" / "research" / "phi.yaml").write_text(NEW_MODEL)


def _new_revision(root: Path) -> None:  # the Job's name hashes its revision: a new name, a new Job
    big = root / "models" / "research" / "big.yaml"
    big.write_text(big.read_text().replace("  model: mistralai/Mistral-7B-Instruct-v0.3\n",
                                           "  model: mistralai/Mistral-7B-Instruct-v0.3\n  revision: v2\n"))


def _nothing(root: Path) -> None:
    pass


SECOND_PASSES = [  # id, the edit between two passes, Jobs created by the second, its summary's tail
    ("unchanged-second-pass-creates-none", _nothing, 0, None),
    ("one-new-model-creates-its-job", _add_model, 1,
     "0 to add, 0 to change, 0 to remove, 0 refused · 0 models affected · 0 workers restarting, 0 in place · 1 "
     "profiler Job created."),
    ("changed-profiler-inputs-create-a-renamed-job", _new_revision, 1,
     "0 to add, 0 to change, 0 to remove, 0 refused · 0 models affected · 0 workers restarting, 0 in place · 1 "
     "profiler Job created."),
]


@pytest.fixture
def repo(tmp_path) -> Path:
    shutil.copytree(FLEET, tmp_path / "repo")
    return tmp_path / "repo"


def test_a_first_render_creates_every_job(repo):
    out = apply(repo)
    assert created_jobs(frozenset(), out.rendered.files) == (JOB,)
    assert summary(out).endswith("· 1 profiler Job created.")


@pytest.mark.parametrize("edit, created, tail", [c[1:] for c in SECOND_PASSES], ids=[c[0] for c in SECOND_PASSES])
def test_the_second_pass_counts_only_the_jobs_it_creates(repo, edit, created, tail):
    first = apply(repo)
    before = frozenset(p.relative_to(repo).as_posix() for p in (repo / "rendered").rglob("*") if p.is_file())
    edit(repo)
    second = apply(repo)
    assert len(created_jobs(before, second.rendered.files)) == created
    if tail is None:  # nothing the summary counts changed: the last summary and the bytes stay, nothing to commit
        assert second.rendered.files["rendered/PLAN.md"] == first.rendered.files["rendered/PLAN.md"]
    else:
        assert summary(second) == f"**Plan:** {tail}"


def files(*names: str) -> dict[str, str]:
    return {name: "" for name in names}


COUNTS = [  # id, previous tree's paths (None: unknown), current tree's paths, the Jobs created
    ("unknown-previous-tree-every-job", None, files(JOB, "rendered/llm/job-profile-b.yaml"), 2),
    ("empty-previous-tree-every-job", frozenset(), files(JOB), 1),
    ("job-already-there-is-not-created", frozenset({JOB}), files(JOB), 0),
    ("renamed-job-is-created", frozenset({"rendered/research/job-profile-mistral-old.yaml"}), files(JOB), 1),
    ("only-jobs-count", frozenset(), files("rendered/llm/deployment-job-x.yaml", "decisions/llm/job-x.yaml",
                                           "rendered/PLAN.md", "rendered/job-not-in-a-namespace.yaml"), 0),
    ("a-removed-job-is-not-created", frozenset({JOB}), files(), 0),
]


@pytest.mark.parametrize("previous, current, created", [c[1:] for c in COUNTS], ids=[c[0] for c in COUNTS])
def test_created_jobs_are_job_files_the_previous_tree_lacks(previous, current, created):
    assert len(created_jobs(previous, current)) == created
