"""The fault test: one bad gpus.yaml, profile or composition never takes the fleet down.

A fleet (the example fleet plus a repository composition that overrides the shipped default)
is reconciled against a real git remote (tests/gitserver.py). Then gpus.yaml, one profile
and the composition are broken in turn, each in several ways. After every broken pass every
object rendered before is still on the branch, byte for byte; the error is in the pass's
report; and after the fix the next pass is a normal one again (no error, nothing held, the
same objects). Then the prune guard: a pass that would remove most rendered objects commits
nothing and says why, until it is confirmed.
"""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from controller.cli.common import show
from controller.cli.offline import OfflineResult, reconcile_once
from gitops import WorkingCopy
from tests.gitserver import git_server, serving  # noqa: F401  (fixture)

FLEET = Path(__file__).resolve().parent.parent / "examples" / "fleet"
PROFILE = "profiles/NVIDIA-H200/qwen--qwen2.5-0.5b-instruct.yaml"
COMPOSITION = "compositions/default.yaml"
ALIAS_BOMB = (Path(__file__).resolve().parent / "fixtures" / "hostile" / "gpus" / "InvalidYAML--alias-bomb.yaml"
              ).read_bytes()
REPO_COMPOSITION = b"""apiVersion: gpushare.dev/v1alpha1
kind: Composition
metadata:
  name: default
spec:
  description: "The fleet's own default: the shipped templates, its registry's image."
  parameters:
    image: registry.example.com/gpushare/worker:1.2.3
  steps:
    profiling:
      perModel: [profiler-rbac.yaml.j2, profiler-job.yaml.j2]
    serving:
      perWorker: [worker-rbac.yaml.j2, worker-configmap.yaml.j2, worker-deployment.yaml.j2]
      perModel: [model-service.yaml.j2]
"""

BREAKS = [
    pytest.param("gpus.yaml", lambda good: good + b"  - name: [\n", id="gpus-syntax-error"),
    pytest.param("gpus.yaml", lambda good: good.replace(b"memory:", b"memroy:"), id="gpus-mistyped-key"),
    pytest.param("gpus.yaml", lambda good: ALIAS_BOMB, id="gpus-alias-bomb"),
    pytest.param(PROFILE, lambda good: good.replace(b"decodeMsPerToken:", b"decodeMsPerToken: .nan\n  x:", 1),
                 id="profile-nan"),
    pytest.param(PROFILE, lambda good: b"? [model]\n: x\n" + good, id="profile-sequence-key"),
    pytest.param(COMPOSITION, lambda good: good.replace(b"image:", b"imagee:"), id="composition-unknown-field"),
    pytest.param(COMPOSITION, lambda good: good[:len(good) // 2], id="composition-truncated"),
]


def rendered(server, name: str = "fleet") -> dict[str, bytes]:
    return {path: data for path, data in server.files(name).items()
            if path.startswith("rendered/") and path != "rendered/PLAN.md"}


def report(result: OfflineResult) -> str:
    out = io.StringIO()
    show(result, out)
    return out.getvalue()


def _reconciled_fleet(server, workdir: Path):
    files = {p.relative_to(FLEET).as_posix(): p.read_bytes() for p in FLEET.rglob("*") if p.is_file()}
    server.create_repo("fleet", {**files, COMPOSITION: REPO_COMPOSITION})
    copy = WorkingCopy(server.url("fleet"), "main", workdir)
    first = reconcile_once(copy)
    assert first.published.changed and not first.output.errors
    before = rendered(server)
    assert any(b"registry.example.com/gpushare/worker:1.2.3" in data for data in before.values()), \
        "the repository composition overrides the shipped default"
    return server, copy, before


@pytest.fixture
def fleet(git_server, tmp_path):  # noqa: F811
    return _reconciled_fleet(git_server, tmp_path / "controller")


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory):
    """One reconciled fleet for the break-and-fix cases: each case leaves the repository as it found it."""
    base = tmp_path_factory.mktemp("shared-fleet")
    with serving(base / "remotes") as server:
        yield _reconciled_fleet(server, base / "controller")


@pytest.mark.integration
@pytest.mark.parametrize("path, breaking", BREAKS)
def test_a_broken_input_keeps_every_rendered_object_and_a_fix_restores_normal_passes(shared_fleet, path, breaking):
    server, copy, before = shared_fleet
    good = server.files("fleet")[path]

    server.push_files("fleet", {path: breaking(good)}, f"a user breaks {path}")
    broken = reconcile_once(copy)

    assert rendered(server) == before, "a previously rendered object changed or disappeared"
    assert path in {e.file for e in broken.output.inputs.errors}
    assert broken.output.held == (path,)
    text = report(broken)
    assert path in text and "last good copy" in text

    server.push_files("fleet", {path: good}, f"a user fixes {path}")
    fixed = reconcile_once(copy)

    assert fixed.output.errors == () and fixed.output.held == () and fixed.hold is None
    assert rendered(server) == before
    assert "no change" in report(reconcile_once(copy, previous=fixed.published))


@pytest.mark.integration
def test_each_input_broken_in_turn_then_all_at_once(fleet):
    server, copy, before = fleet
    good = {path: server.files("fleet")[path] for path in ("gpus.yaml", PROFILE, COMPOSITION)}
    for path in good:
        server.push_files("fleet", {path: b"not: [valid"}, f"break {path}")
        assert reconcile_once(copy).output.held == (path,)
        assert rendered(server) == before
        server.push_files("fleet", {path: good[path]}, f"fix {path}")
    server.push_files("fleet", {path: b"{" for path in good}, "break all three")
    broken = reconcile_once(copy)
    assert set(broken.output.held) == set(good) and rendered(server) == before
    server.push_files("fleet", good, "fix all three")
    assert reconcile_once(copy).output.errors == ()
    assert rendered(server) == before


@pytest.mark.integration
def test_the_prune_guard_holds_a_pass_that_would_remove_most_objects_until_confirmed(fleet):
    server, copy, before = fleet
    head = server.push_files("fleet", {"gpus.yaml": None}, "the inventory is deleted (not broken: gone)")

    held = reconcile_once(copy)

    assert held.hold is not None and not held.published.changed
    assert server.head("fleet") == head and rendered(server) == before
    text = report(held)
    assert "held:" in text and f"from {len(before)} to" in text and "--max-prune-share 1" in text

    confirmed = reconcile_once(copy, max_prune_share=1.0)

    assert confirmed.hold is None and confirmed.published.changed
    assert len(rendered(server)) < len(before) / 2


@pytest.mark.integration
@pytest.mark.parametrize("link", ["models/stolen.yaml", "gpus.yaml"])
def test_a_committed_symlink_out_of_the_repository_is_never_read(fleet, tmp_path, link):
    server, copy, before = fleet
    secret = tmp_path / "token"
    secret.write_text("ghp_aTokenOnTheControllersDisk\n")
    files = {link: None} if link in server.files("fleet") else {}
    server.push_files("fleet", files, "a symlink to the controller's disk", links={link: str(secret)})

    result = reconcile_once(copy)

    assert [(e.file, e.reason) for e in result.output.inputs.errors] == [(link, "UnsafePath")]
    assert rendered(server) == before
    everything = report(result) + "".join(data.decode(errors="replace") for data in server.files("fleet").values())
    assert "ghp_aTokenOnTheControllersDisk" not in everything
