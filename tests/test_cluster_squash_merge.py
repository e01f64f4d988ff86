"""Synced and Ready follow content: when a review branch's generated tree reaches the tracked branch through a
squash merge (a new commit, not a descendant of the controller's), the model turns Synced and Ready once Argo CD
syncs it. End to end: the official client against the API server double, a real git remote."""
from __future__ import annotations

import pytest

from tests.cluster_loop_support import REPO, World, model_doc
from tests.gitserver import git, git_server  # noqa: F401  (the fixture)
from tests.kubedouble import kube  # noqa: F401  (the fixture)
from contract.verdicts import Verdict

pytestmark = pytest.mark.integration
REVIEW = "gpushare/plan"


@pytest.fixture
def world(kube, git_server, tmp_path) -> World:  # noqa: F811
    return World(kube, git_server, tmp_path)


def squash_merge(world: World) -> str:
    """What a forge's squash merge does: one new commit on main with the review branch's tree; its id."""
    bare = world.server.path(REPO)
    commit = git("commit-tree", f"{REVIEW}^{{tree}}", "-p", "main", "-m", "gpushare plan (#1)", cwd=bare)
    git("update-ref", "refs/heads/main", commit, cwd=bare)
    return commit


def test_a_squash_merged_review_branch_makes_the_model_synced_and_ready(world):
    world.setup([model_doc()])
    controller = world.reconciler(target=f"branch:{REVIEW}")
    assert controller.reconcile_once().ok
    world.publish_profile()
    second = controller.reconcile_once()
    assert second.ok and second.published.branch == REVIEW
    merged = squash_merge(world)
    ancestors = git("rev-list", merged, cwd=world.server.path(REPO)).split()
    assert second.published.commit not in ancestors  # not a descendant: only the content matches
    world.worker_rolls_out()
    world.worker_reports(Verdict("chat", "llm", "resident", "applied", "Fits", "loaded", 1 << 30, 20 << 30, 0))
    world.argo_syncs(merged)
    assert controller.reconcile_once().ok
    conditions = world.conditions()
    assert (conditions["Synced"]["status"], conditions["Ready"]["status"]) == ("True", "True")


def test_a_synced_revision_without_the_models_content_is_not_synced(world):
    world.setup([model_doc()])
    controller = world.reconciler(target=f"branch:{REVIEW}")
    assert controller.reconcile_once().ok
    world.publish_profile()
    assert controller.reconcile_once().ok
    world.argo_syncs(world.head())  # main, where the review branch was never merged
    assert controller.reconcile_once().ok
    assert world.conditions()["Synced"]["status"] == "False"
