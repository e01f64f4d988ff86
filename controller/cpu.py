"""How a large pass spends this process and its CPUs.

Owns `forked_map`: the first part runs in this process, every other part in a forked child
that inherits the function and its arguments (nothing is pickled on the way in, so arguments
such as Jinja environments that do not pickle are fine); only the results come back pickled.
Used by controller.rendering.compose (the slot groups of a large plan) and
controller.inputs.reader (the decision records of a large fleet); each decides when a part
is large enough to be worth a process. And `gc_paused`: Python's cyclic garbage collector
waits while a pass builds its hundreds of thousands of short-lived objects, which it would
otherwise scan again and again (bench/pass_parts.py prints its share of compose's CPU), and runs
once after, by `collect`, off the path to the commit.
Used by the shells around one pass (controller.cli.offline, controller.cli.cluster_loop); `collect` by the
poll loop (controller.cli.loop) between passes. And `in_background`, with which the shells compile what a pass
uses (controller.rendering.compose.warm_up) while git fetches.
"""
from __future__ import annotations

import gc
import multiprocessing
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

_JOBS: list[tuple[Callable[..., Any], tuple]] = []  # what the forked children run, inherited at fork


def _run(index: int) -> Any:
    function, args = _JOBS[index]
    return function(*args)


def forked_map(function: Callable[..., Any], parts: Sequence[tuple]) -> list[Any]:
    """[function(*part) for part in parts], the parts after the first in forked processes."""
    global _JOBS
    if len(parts) <= 1:
        return [function(*part) for part in parts]
    _JOBS = [(function, tuple(part)) for part in parts]
    try:
        with ProcessPoolExecutor(len(parts) - 1, mp_context=multiprocessing.get_context("fork")) as pool:
            others = [pool.submit(_run, i) for i in range(1, len(parts))]
            return [function(*parts[0])] + [other.result() for other in others]
    finally:
        _JOBS = []


def in_background(function: Callable[[], object]) -> Callable[[], None]:
    """Start `function` in a thread, to use this process while it waits on another (git's fetch); call what is
    returned to wait for it, before anything forks (a thread running through a fork can leave a lock held in
    the child). What it raises is dropped: it only prepares what the pass would otherwise do, and report, itself."""
    def run() -> None:
        try:
            function()
        except Exception:  # noqa: BLE001 - the pass meets the same problem and reports it
            pass

    thread = threading.Thread(target=run, name=f"prepare-{getattr(function, '__name__', 'work')}", daemon=True)
    thread.start()
    return thread.join


def runs(items: Sequence[Any], parts: int) -> list[Sequence[Any]]:
    """`items` cut into at most `parts` consecutive runs of about equal length, in order (none for no items)."""
    size = -(-len(items) // max(1, parts))
    return [items[i:i + size] for i in range(0, len(items), size or 1)]


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside (reference counting still frees almost everything at once); on the
    way out, what is alive is frozen (`gc.freeze`, which costs nothing) and the collector is on again, so the
    automatic collections while the pass's result is committed and pushed never rescan the pass's objects (a
    full collection over them is a visible share of a large pass); `collect` scans them once, when the shell has
    time. As it was before if the collector was already off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def collect() -> int:
    """Give back what the passes froze to the collector and collect once (the poll loop, after each pass); the
    number of unreachable objects found."""
    gc.unfreeze()
    return gc.collect()
