"""What a platform team consumes besides the manifests: images labelled per OCI, on a pinned base, installing
exactly the locked dependencies (hashes); the locks cover pyproject's dependencies; LICENSE is the license
pyproject declares; CHANGELOG.md has a section per release."""
from __future__ import annotations

import re
import tomllib

import pytest

from tests.conftest import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
IMAGES = {"Dockerfile.controller": ("controller.lock", []), "Dockerfile.worker": ("worker.lock", ["runtime"])}
OCI = ("title", "description", "licenses", "version", "revision", "created", "base.name")


def _name(requirement: str) -> str:
    """The PEP 503 normalised project name of a requirement."""
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower())


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_images_are_labelled_pinned_and_install_the_lock(dockerfile):
    text = (REPO_ROOT / dockerfile).read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M).group(1)
    assert re.search(r":\d+\.\d+\.\d+-slim-[a-z]+$", base) or "@sha256:" in base, base  # a patch release, a distro
    for label in OCI:
        assert f"org.opencontainers.image.{label}=" in text, label
    lock = IMAGES[dockerfile][0]
    assert f"--require-hashes -r requirements/{lock}" in text and "--no-deps ." in text


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_each_lock_pins_every_dependency_with_hashes(dockerfile):
    lock, extras = IMAGES[dockerfile]
    text = (REPO_ROOT / "requirements" / lock).read_text()
    pinned = {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", text, re.M)}
    wanted = PYPROJECT["project"]["dependencies"] + [r for e in extras
                                                     for r in PYPROJECT["project"]["optional-dependencies"][e]]
    missing = {_name(r) for r in wanted} - {_name(n) for n in pinned}
    assert not missing, f"requirements/{lock} lacks {sorted(missing)}: run `make lock`"
    assert text.count("==") == len(pinned) and text.count("--hash=sha256:") >= len(pinned)
    if "runtime" in extras:
        assert pinned["torch"] == "2.13.0"


def test_license_and_changelog():
    assert PYPROJECT["project"]["license"]["text"] == "Apache-2.0"
    assert "Apache License" in (REPO_ROOT / "LICENSE").read_text()[:200]
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    assert re.search(r"^## \[Unreleased\]", changelog, re.M) and re.search(r"^## \[0\.1\.0\]", changelog, re.M)
