"""The prune guard at its boundary: exact arithmetic on distinct paths, the change it holds, and a message that
states the share removed, the limit and the setting (controller.passes.reconcile.prune_hold, guarded_change)."""
from __future__ import annotations

import pytest

from controller.passes.reconcile import guarded_change, prune_hold


def objects(n: int, kind: str = "configmap") -> list[str]:
    return [f"rendered/ns/{kind}-w{i}.yaml" for i in range(n)]


# (objects upstream, objects removed, the share allowed, held?)
BOUNDARY = [
    pytest.param(100, 29, 0.29, False, id="exactly-29-percent-of-100-is-allowed-float-0.29x100-is-28.99"),
    pytest.param(100, 30, 0.29, True, id="one-more-than-29-percent-is-held"),
    pytest.param(10, 7, 0.7, False, id="exactly-70-percent-is-allowed-float-0.7x10-is-7.000001"),
    pytest.param(10, 8, 0.7, True, id="one-more-than-70-percent-is-held"),
    pytest.param(10, 5, 0.5, False, id="exactly-half-is-allowed"),
    pytest.param(10, 6, 0.5, True, id="one-more-than-half-is-held"),
    pytest.param(3, 1, 0.333, True, id="a-third-is-more-than-0.333"),
    pytest.param(1000, 333, 0.333, False, id="exactly-0.333-of-1000-is-allowed"),
    pytest.param(1000, 334, 0.333, True, id="334-of-1000-is-more-than-0.333"),
    pytest.param(7, 0, 0.0, False, id="share-0-allows-no-removal-at-all"),
    pytest.param(7, 1, 0.0, True, id="share-0-holds-one-removal"),
    pytest.param(7, 7, 1.0, False, id="share-1-allows-removing-everything"),
    pytest.param(1, 1, 0.99, True, id="the-last-object-is-held-below-share-1"),
    pytest.param(0, 0, 0.0, False, id="nothing-upstream-nothing-to-hold"),
]


@pytest.mark.parametrize("count, removed, share, held", BOUNDARY)
def test_the_guard_is_exact_at_the_boundary(count, removed, share, held):
    before = [*objects(count), "rendered/PLAN.md", "decisions/ns/a.yaml"]
    after = [*objects(count - removed), "rendered/PLAN.md"]
    hold = prune_hold(before, after, share)
    assert (hold is not None) == held
    if held:
        assert (hold.before, hold.after) == (count, count - removed)


@pytest.mark.parametrize("count, removed, share, removed_shown, limit_shown", [
    pytest.param(100, 30, 0.29, "(30%)", "limit of 29%", id="whole-percents-when-they-differ"),
    pytest.param(3, 1, 0.333, "(33.33%)", "limit of 33.30%", id="decimals-until-they-differ"),
    pytest.param(1000, 501, 0.5, "(50.1%)", "limit of 50.0%", id="never-50-percent-more-than-50-percent"),
    pytest.param(7, 1, 0.0, "(14%)", "limit of 0%", id="share-0"),
])
def test_the_message_states_the_share_the_limit_and_the_setting(count, removed, share, removed_shown, limit_shown):
    hold = prune_hold(objects(count), objects(count - removed), share)
    assert hold is not None
    message = hold.message
    assert f"removes {removed} of {count} {removed_shown}" in message
    assert limit_shown in message
    assert f"--max-prune-share (or GPUSHARE_MAX_PRUNE_SHARE) = {share:g}" in message
    assert f"from {count} to {count - removed}" in message
    assert "--max-prune-share 1" in hold.fix


@pytest.mark.parametrize("files, keep, held", [
    pytest.param(objects(5), set(), False, id="half-left-is-allowed"),
    pytest.param(objects(4), set(), True, id="four-left-is-held"),
    pytest.param(objects(4) + objects(4), set(), True, id="a-path-listed-twice-is-one-object"),
    pytest.param(objects(4), set(objects(4)), True, id="a-kept-path-also-rendered-counts-once"),
    pytest.param(objects(4), {"rendered/other/configmap-x.yaml"}, True, id="a-kept-path-upstream-lacks-is-no-object"),
    pytest.param(objects(4), {objects(10)[9]}, False, id="a-kept-upstream-object-stays"),
    pytest.param(objects(5, "job"), set(), False, id="replaced-objects-are-no-removal"),
])
def test_guarded_change_counts_what_the_pass_leaves(files, keep, held):
    before = objects(10)
    guarded = guarded_change(before, {p: b"x" for p in files}, 0.5, frozenset(keep))
    assert (guarded.hold is not None) == held
    if held:  # the held change: nothing written, every upstream path kept as it is
        assert guarded.files == {} and guarded.keep == frozenset(before)
    else:
        assert set(guarded.files) == set(files) and guarded.keep == frozenset(keep)
