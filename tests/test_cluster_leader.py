"""controller.kube.leader: Lease election between candidates against the API server double, with a driven clock."""
from __future__ import annotations

import kmock
import pytest

from controller.kube.leader import LeaderElection
from tests.kubedouble import kube  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration

LEASES = kmock.resource("coordination.k8s.io", "v1", "leases")


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _candidate(kube, identity: str, clock: Clock) -> LeaderElection:
    return LeaderElection(kube.api_client, namespace="gpushare-system", identity=identity, clock=clock,
                          lease_duration_s=15, renew_deadline_s=10)


def _lease(kube) -> dict:
    return kube.get("coordination.k8s.io/v1", "leases", "gpushare-system", "gpushare-controller")


def test_two_candidates_one_leader_then_takeover_after_expiry(kube):
    clock = Clock()
    a, b = _candidate(kube, "pod-a", clock), _candidate(kube, "pod-b", clock)
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    assert (a.is_leader, b.is_leader) == (True, False)

    clock.now += 5
    assert a.try_acquire_or_renew() is True  # renewing moves renewTime
    clock.now += 14
    assert b.try_acquire_or_renew() is False  # the record changed 14 s ago by b's clock: not expired

    clock.now += 15  # pod-a stopped renewing 15 s ago (by b's observation)
    assert b.try_acquire_or_renew() is True
    assert a.try_acquire_or_renew() is False  # the old leader yields
    assert (a.is_leader, b.is_leader) == (False, True)
    spec = _lease(kube)["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"], spec["leaseDurationSeconds"]) == ("pod-b", 1, 15)


def test_racing_writers_one_wins_by_resource_version(kube):
    clock = Clock()
    holder, b, c = (_candidate(kube, name, clock) for name in ("pod-a", "pod-b", "pod-c"))
    holder.try_acquire_or_renew()
    b.try_acquire_or_renew(), c.try_acquire_or_renew()  # both observe the record
    clock.now += 16  # the holder is gone; b and c both see the lease expired
    stale = c._read()  # c reads ...
    assert b.try_acquire_or_renew() is True  # ... b writes first ...
    c._read = lambda: stale  # ... and c writes with what it read before
    puts = len([r for r in kube.mock._requests if r.method == "PUT"])
    assert c.try_acquire_or_renew() is False  # the API server answered 409 ...
    assert len([r for r in kube.mock._requests if r.method == "PUT"]) == puts + 1  # ... to c's write
    assert _lease(kube)["spec"]["holderIdentity"] == "pod-b"


def test_release_lets_a_successor_take_over_at_once(kube):
    clock = Clock()
    a, b = _candidate(kube, "pod-a", clock), _candidate(kube, "pod-b", clock)
    a.try_acquire_or_renew()
    a.release()
    assert a.is_leader is False
    assert b.try_acquire_or_renew() is True


def test_a_leader_that_cannot_renew_stops_before_the_lease_expires(kube):
    clock = Clock()
    a = _candidate(kube, "pod-a", clock)
    assert a.try_acquire_or_renew() is True
    kube.fail(500, 100, "get", LEASES)
    clock.now += 5
    assert a.try_acquire_or_renew() is True  # within the renew deadline (10 s) of the last renewal
    clock.now += 6
    assert a.try_acquire_or_renew() is False  # 11 s without renewal: stop writing, others may take over at 15 s
    assert a.is_leader is False


def test_renew_deadline_must_be_shorter_than_the_lease(kube):
    with pytest.raises(ValueError, match="two leaders could overlap"):
        LeaderElection(kube.api_client, namespace="x", identity="a", lease_duration_s=10, renew_deadline_s=10)
