"""How a large pass spends the process: work split over forked processes gives what one process gives (the
helper itself, and the decision records read with it), and the garbage collector pauses for a pass."""
from __future__ import annotations

import os
import weakref
import shutil

import pytest

from controller.cli.loop import Outcome, run_loop
from controller.cpu import collect, forked_map, gc_paused
from controller.inputs import reader
from tests.test_reconcile_pass import FLEET, reconcile_into


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_forked_map_keeps_the_order_and_runs_the_first_part_here():
    results = forked_map(_square_and_pid, [(i,) for i in range(4)])
    assert [value for value, _ in results] == [0, 1, 4, 9]
    assert results[0][1] == os.getpid() and all(pid != os.getpid() for _, pid in results[1:])


def _fails_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("part two is broken")
    return x


def test_forked_map_raises_what_a_forked_part_raised():
    with pytest.raises(ValueError, match="part two is broken"):
        forked_map(_fails_on_two, [(1,), (2,)])


def test_decision_records_read_in_several_processes_equal_one_process(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    shutil.copytree(FLEET, repo)
    reconcile_into(repo)
    records = sorted((repo / "decisions").rglob("*.yaml"))
    records = [p for p in records if "_last-good" not in p.parts and "rightsizing" not in p.parts]
    records[0].write_text("status: [not, a, record\n")  # garbled: skipped in both
    duplicate = records[-1].parent / "zz-copy.yaml"  # the same decision twice: the later path wins in both
    duplicate.write_text(records[1].read_text())
    one = reader.load_decision_records(repo)
    monkeypatch.setattr(reader, "PARALLEL_MIN_RECORDS", 1)
    for processes in (2, 3):
        several = reader.load_decision_records(repo, processes)
        assert list(several.items()) == list(one.items())
    assert len(one) == len(records) - 1


def _cycle() -> weakref.ref:
    """A weak reference to a cycle only the collector frees, dropped at once."""
    node = _Node()
    node.me = node
    return weakref.ref(node)


def test_the_garbage_collector_waits_inside_and_collects_after():
    import gc

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: still off, and the outer one turns it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
        alive = _cycle()
        assert alive() is not None
    assert gc.isenabled()
    gc.collect()  # the automatic collections leave the pass's objects alone
    assert alive() is not None
    assert collect() >= 2  # the node and its __dict__
    assert alive() is None


def test_the_poll_loop_collects_what_a_pass_left():
    left: list[weakref.ref] = []

    def one_pass() -> Outcome:
        with gc_paused():
            left.append(_cycle())
        assert all(ref() is None for ref in left[:-1])  # the earlier passes' garbage is gone
        return Outcome(True)

    assert run_loop(one_pass, 1.0, wait=lambda seconds: None, passes=3) == 0
    assert [ref() for ref in left] == [None, None, None]



class _Node:
    me: object = None


def test_models_read_in_several_processes_equal_one_process(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    shutil.copytree(FLEET, repo)
    (repo / "models" / "broken.yaml").write_text("apiVersion: [\n")  # its error is reported in both
    one = reader.read_models(repo)
    monkeypatch.setattr(reader, "PARALLEL_MIN_BYTES", 1)
    several = reader.read_models(repo, 2)
    assert several == one and one[1] and one[0]
