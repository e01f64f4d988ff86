"""One repository of a table-driven case, twice: as a plain directory and as a controller's sparse copy of it.

Owns `Link` (a symlink in a case's files) and `plain_and_served`, used by the tests that hold what a controller
reads from git (tests/test_catalog_from_git.py, tests/test_models_from_git.py) to what a plain directory holds:
the files are written under `tmp_path/plain`, served from a real remote on 127.0.0.1 (tests/gitserver.py, with
filtered fetches) and checked out by controller.cli.common.controller_copy for `layout`.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from controller.cli.common import controller_copy
from controller.inputs.layout import Layout
from gitops import Checkout, WorkingCopy
from tests.gitserver import serving


class Link(str):
    """A symlink in a case's repository, to this target."""


@contextmanager
def plain_and_served(tmp_path: Path, files: Mapping[str, bytes | Link], layout: Layout
                     ) -> Iterator[tuple[Path, WorkingCopy, Checkout]]:
    """(the plain directory, the controller's copy, its Checkout of the head), while the remote serves."""
    plain = tmp_path / "plain"
    for path, data in files.items():
        (plain / path).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, Link):
            (plain / path).symlink_to(data)
        else:
            (plain / path).write_bytes(data)
    with serving(tmp_path / "remote", filters=True) as server:
        server.create_repo("fleet.git", {path: data for path, data in files.items() if not isinstance(data, Link)})
        links = {path: str(data) for path, data in files.items() if isinstance(data, Link)}
        if links:
            server.push_files("fleet.git", {}, "symlinks", links=links)
        copy = controller_copy(server.url("fleet.git"), "main", tmp_path / "wd", layout=layout)
        head = copy.sync()["main"]
        yield plain, copy, Checkout.at(copy, head, layout.cluster_generated)
