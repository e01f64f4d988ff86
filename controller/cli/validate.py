"""`gpushare validate FILE|DIR...` on files: single files or directories of YAML files (a pre-commit hook).

Owns checking what the command line names that is not a GitOps repository (a repository gets the whole
pass: controller.cli.commands): a directory is every YAML file under it; a file is checked by the kind of
each of its documents (ElasticModel, ModelProfile, GPUInventory, Composition). Models and profiles of all
the named files are combined, so a name defined twice is reported. The parsing is controller.inputs.load's
and controller.inputs.compositions'. Called by controller.cli.commands.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from controller.inputs.load import combine, load_documents, parse_inventory, parse_model, parse_profile
from controller.inputs.repofiles import YAML_SUFFIXES
from controller.inputs.utf8 import NotUtf8, decode_utf8
from controller.inputs.compositions import parse_composition
from controller.types import ElasticModel, GpuSlot, InputError, Inputs, Profile, Source

KINDS = ("ElasticModel", "ModelProfile", "GPUInventory", "Composition")


@dataclass
class _Found:
    models: list[ElasticModel] = field(default_factory=list)
    profiles: list[Profile] = field(default_factory=list)
    slots: list[GpuSlot] = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)
    compositions: int = 0


def validate_paths(paths: list[Path]) -> tuple[Inputs, int]:
    """Every input the paths hold, checked; and how many compositions were among them."""
    found = _Found()
    for path in paths:
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in YAML_SUFFIXES and p.is_file())
            if not files:
                found.errors.append(InputError(str(path), None, "", reason="NothingToValidate",
                                               message=f"{path} has no models/ directory and no YAML file, so "
                                                       "nothing was checked",
                                               fix="name the root of a GitOps repo (with models/), a directory "
                                                   "of YAML files, or the files"))
            for file in files:
                _file(file, found)
        elif path.is_file():
            _file(path, found)
        else:
            found.errors.append(InputError(str(path), None, "", reason="PathNotFound",
                                           message=f"{path} does not exist",
                                           fix="name a GitOps repository, a directory or a YAML file"))
    return combine(found.models, found.profiles, found.slots, found.errors), found.compositions


def _file(path: Path, found: _Found) -> None:
    name = path.as_posix()
    try:
        text = decode_utf8(path.read_bytes())
    except (OSError, NotUtf8) as exc:
        said = exc.strerror if isinstance(exc, OSError) else str(exc)
        found.errors.append(InputError(name, None, "", reason="UnreadableFile", message=f"cannot read the file: {said}",
                                       fix="save it as UTF-8 text and check its permissions"))
        return
    docs, errors = load_documents(text, name)
    found.errors += errors
    for index, doc in docs:
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if kind == "ElasticModel":
            model, errors = parse_model(doc, Source(name, index))
            found.models += [model] if model else []
        elif kind == "ModelProfile":
            profile, errors = parse_profile(doc, name, index)
            found.profiles += [profile] if profile else []
        elif kind == "GPUInventory":
            slots, errors = parse_inventory(doc, name, index)
            found.slots += slots
        elif kind == "Composition":
            composition, errors = parse_composition(doc, name, index)
            found.compositions += composition is not None
        else:
            errors = [InputError(name, index, "kind", reason="UnknownKind",
                                 message=f"kind {kind!r} is none of {', '.join(KINDS)}",
                                 fix="set apiVersion gpushare.dev/v1alpha1 and one of those kinds, or leave the "
                                     "file out of the check")]
        found.errors += errors
