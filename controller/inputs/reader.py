"""The one reader of a GitOps directory: what every command and loop plans from.

Owns reading a checked-out tree into two values (controller.inputs.tree): the `Tree` (ElasticModels
under models/**, profiles under profiles/**, gpus.yaml's slots and prices, compositions under
compositions/** over the shipped ones, the right-sizing records under decisions/rightsizing/, the
measured profiles committed under profiles/measured/, the last good copy of each input file under
decisions/_last-good/<path>) and the `LastPass` it holds (each decision with the last good spec it was
made from, the last rendered/PLAN.md, each model's generated paths, every generated path, the rendered
workers). `read_repo` is used by `gpushare validate`, `plan` and `explain`, by offline and cluster
passes (which hand the Tree whole to controller.passes.reconcile.run_pass) and by the right-sizing pass,
so they all plan from the same inputs, checked by the same `check_inputs` and revived alike
(`Tree.planned`): validate refuses exactly what reconcile refuses.

The controller's paths (what LastPass lists, which rendered workers and right-sizing records there
are) come from the listing the shell hands in, `generated` (git's listing of the checked-out commit:
the controller's working copy checks out only what a pass reads); a plain directory (validate, plan,
explain) is listed as it is.

Every file is read through controller.inputs.repofiles, so nothing outside the repository is ever read; what the
controller's sparse checkout leaves out (with clusters/, models/ among it) comes from git through `committed`,
with the errors a work tree's read gives. A gpus.yaml, profile or composition file with any error is read from
its last good copy while there is one (its errors are still reported), so one bad file never takes the fleet
down; a broken model keeps its last good spec through its decision record. The only I/O of the input stage; the
parsers it calls (controller.inputs.load, compositions, rightsizing_records) are pure.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Protocol

import schemas
import yaml
from contract import wire
from contract.wire import SOURCE_ANNOTATION
from controller import placement as placement_rules, types as model_types
from controller.cpu import forked_map, runs
from controller.inputs.clusters import Catalog, Elsewhere, cluster_name_problem, folder_errors, inventory_path, placed
from controller.inputs.compositions import Composition, parse_composition, shipped_compositions
from controller.inputs.kube_rules import labels as label_problems
from controller.inputs.layout import (CLUSTERS_DIR, COMPOSITIONS_DIR, INVENTORY_FILE, MEASURED_PROFILES_DIR,
                                      MODELS_DIR, PROFILES_DIR, SINGLE, WORKER_FILES, Layout)
from controller.inputs.load import (DecisionRecord, Inventory, load_documents, parse_gpu_inventory, parse_model,
                                    parse_prices, parse_profile)
from controller.inputs.repofiles import (STATE_FACTOR, YAML_SUFFIXES, RepoFileError, decoded, is_file,
                                         max_file_bytes, max_state_bytes, not_a_file, owned_files, read_optional,
                                         read_text, read_texts, too_large, unopenable, unsafe_path, yaml_files)
from controller.inputs.rightsizing_records import Records, effective_models, records_from
from controller.inputs.tree import LastPass, Tree
from controller.inputs.yaml_limits import YamlLimits
from controller.serialize import decision_from_dict
from controller.types import ElasticModel, InputError, Inputs, Profile, Source

LABELS_FIX = ("write Kubernetes labels: keys an optional DNS prefix and '/', then a name; values at most 63 letters, "
              "digits, '-', '_' or '.'")

log = logging.getLogger("gpushare.inputs")


def load_repo(root: Path) -> Inputs:
    """The checked inputs of `read_repo`: models, profiles, GPU slots and every error; a model under right-sizing
    policy Auto carries the effective budget its record under decisions/rightsizing/ holds."""
    return read_repo(root).inputs


class Committed(Protocol):
    """The checked-out commit as git holds it (gitops.Checkout), for the files the controller's sparse work tree
    leaves out: the decision records, the workers' Deployments and ConfigMaps, PLAN.md, every cluster's gpus.yaml
    and, with clusters/, the ElasticModels under models/."""

    def read(self, paths: Iterable[str], limit: int) -> Mapping[str, bytes]:
        """The content of each of `paths` that is a regular file of at most `limit` bytes; the others left out."""

    def contents(self, paths: Iterable[str], limit: int) -> Mapping[str, bytes | int | str]:
        """`read` of each of `paths`; for each it leaves out, its size (over `limit`) or why (gitops.Checkout)."""

    def files(self, folder: str) -> Mapping[str, str]:
        """Every file, symlink and submodule under `folder` (path -> kind; `unsafe`: a symlink out of the
        repository), symlinked folders listed through."""

    def kinds(self, paths: Iterable[str]) -> Mapping[str, str]:
        """What each of `paths` that is there and no folder is: `file`, `symlink` or `submodule`."""

    def children(self, folder: str) -> Mapping[str, str] | None:
        """name -> `folder`, `file`, `symlink` or `submodule` directly in `folder`; None when it is no folder."""

    def blob_ids(self, paths: Iterable[str]) -> Mapping[str, str]:
        """The id of the blob each of `paths` reads as; those that read as no regular file left out."""

    def remembered(self, name: str, key: str) -> frozenset[str]:
        """The blob ids the work directory's note `name` holds under `key` (none where it holds none under it)."""

    def remember(self, name: str, key: str, ids: Iterable[str]) -> None:
        """Keep `ids` in the work directory's note `name` under `key`, in place of what it held."""


class ClusterNotFound(ValueError):
    """A cluster asked for (`--cluster NAME`) that the repository does not hold, or none asked for where one must
    be; the message says which clusters there are."""

    reason = "UnknownCluster"

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message, self.fix = message, fix


def repository_clusters(root: Path, committed: Committed | None = None) -> tuple[str, ...] | None:
    """The clusters a repository plans (folders under clusters/ with a gpus.yaml and a usable name), sorted; None
    for the single-cluster layout (no clusters/ folder). `committed`: list them from git (a controller's sparse
    work tree holds no other cluster's folder), as read_repo takes it."""
    catalog = read_catalog(root, committed=committed)
    return None if catalog is None else catalog.names


def read_repo(root: Path, processes: int = 1, *, generated: Iterable[str] | None = None,
              committed: Committed | None = None, cluster: str | None = None) -> Tree:
    """Every input file of a GitOps tree, parsed (each broken gpus.yaml, profile or composition from its last
    good copy), the compositions, the right-sizing records and prices, and the last pass the tree holds; files
    are read sorted. `processes`: how many processes may read a large fleet's decision records. `generated`:
    every path under the controller's prefixes (a Layout's cluster_generated, or the shell's own) as git holds
    them in the checked-out commit, of which the work tree may hold only those a pass reads; None: list them from
    the directory (a plain directory, not the controller's checkout). `committed`: the checked-out commit in git
    (gitops.Checkout), for what the controller's sparse work tree leaves out (the decision records, the rendered
    workers, PLAN.md, the clusters' folders and inventories); None: read them from the directory. `cluster`: the cluster to read in a repository with clusters/ (its inventory, the
    models that select it, its own generated tree and no other's); None in the single-cluster layout.
    ClusterNotFound when that does not fit the repository."""
    root = Path(root)
    layout = Layout(cluster)
    catalog = read_catalog(root, layout, committed)
    check_cluster(catalog, cluster)
    models, model_errors = read_models(root, processes, keep_documents=catalog is not None, layout=layout,
                                       elsewhere=None if catalog is None else Elsewhere(cluster, catalog),
                                       committed=committed)
    models, placement_errors = placed(models, cluster, catalog)
    profiles, shared = read_profile_trees(root, layout, catalog)
    inventory = read_inventory(root, layout)
    compositions = read_compositions(root, layout)
    measured = {rel: text for rel in owned_files(root, (layout.measured,))
                if (text := read_optional(root, rel)) is not None}
    read = TreeRead().add(profiles).add(inventory).add(compositions.read)
    rightsizing = read_rightsizing(root, generated, layout)
    model_errors = [*model_errors, *placement_errors, *(catalog.errors if catalog else ()),
                    *(p.as_input_error() for p in rightsizing.problems)]  # `validate` shows them
    gpus = inventory.values[0] if inventory.values else Inventory()
    return Tree(effective_models(models, rightsizing), tuple(model_errors), tuple(profiles.values),
                tuple(profiles.errors), gpus.slots, tuple(inventory.errors), measured,
                compositions.compositions, tuple(compositions.read.errors), read.last_good, tuple(sorted(read.held)),
                rightsizing, read_prices(root, layout), read_last_pass(root, processes, generated, committed, layout),
                gpus.pools, layout=layout, shared_profiles=shared, clusters=catalog.names if catalog else ())


def check_cluster(catalog: Catalog | None, cluster: str | None) -> None:
    """ClusterNotFound unless `cluster` fits the repository: None without clusters/, one of its clusters with it."""
    if catalog is None and cluster is not None:
        raise ClusterNotFound(f"cluster {cluster!r} was asked for, but the repository has no {CLUSTERS_DIR}/ folder: "
                              "it is one implicit cluster", "leave --cluster out, or add "
                              f"{CLUSTERS_DIR}/<name>/{INVENTORY_FILE} for each cluster")
    if catalog is not None and cluster not in catalog.labels:
        known = ", ".join(catalog.names) or "none"
        raise ClusterNotFound(f"the repository has {CLUSTERS_DIR}/ (clusters: {known}), and "
                              + (f"{cluster!r} is none of them" if cluster else "no cluster was named"),
                              f"name one of them with --cluster NAME, or add {inventory_path(cluster or '<name>')}")


def read_catalog(root: Path, own: Layout = SINGLE, committed: Committed | None = None) -> Catalog | None:
    """The clusters under clusters/ (controller.inputs.clusters.Catalog): each folder with a usable name and a
    gpus.yaml, with the labels it declares; None without a clusters/ folder (the single-cluster layout). `own`:
    the cluster being read, whose labels come from its last good gpus.yaml while that file is broken (so a broken
    file never moves a model off it); another cluster's labels are None while its file cannot be read.
    `committed`: the folders and inventories are read from git (a controller's sparse work tree holds its own
    cluster's folder only), else from the directory."""
    listing = _cluster_folders(root, committed)
    if listing is None:
        return None
    folders, has, texts = listing
    errors = folder_errors(folders, has, is_file(root, INVENTORY_FILE))
    labels: dict[str, Mapping[str, str] | None] = {}
    for name in folders:
        if cluster_name_problem(name) is not None or not has[name]:
            continue
        rel = inventory_path(name)
        found, problems = _cluster_labels(texts.get(rel), rel)
        if found is None and name == own.cluster:
            kept = last_good_path(rel, own)
            found, _ = _cluster_labels(read_optional(root, kept), kept)
        labels[name] = found
        errors += problems
    return Catalog(MappingProxyType(labels), tuple(errors))


def _cluster_folders(root: Path, committed: Committed | None
                     ) -> tuple[list[str], dict[str, bool], dict[str, str]] | None:
    """The folders under clusters/ (sorted), whether each holds a gpus.yaml, and the text of each that can be read
    (a usable folder name's only); None without a clusters/ folder. From git with `committed`, else the directory."""
    if committed is None:
        base = Path(root) / CLUSTERS_DIR
        if base.is_symlink() or not base.is_dir():
            return None
        try:
            folders = sorted(entry.name for entry in os.scandir(base) if entry.is_dir(follow_symlinks=False))
        except OSError:
            folders = []
        has = {name: is_file(root, inventory_path(name)) for name in folders}
        return folders, has, {rel: text for name in folders if has[name] and cluster_name_problem(name) is None
                              if (text := read_optional(root, rel := inventory_path(name))) is not None}
    children = committed.children(CLUSTERS_DIR)
    if children is None:
        return None
    folders = sorted(name for name, kind in children.items() if kind == "folder")
    there = committed.kinds(inventory_path(name) for name in folders)
    has = {name: inventory_path(name) in there for name in folders}
    wanted = [inventory_path(name) for name in folders if has[name] and cluster_name_problem(name) is None]
    return folders, has, _decoded(committed.read(wanted, max_file_bytes()))


def _cluster_labels(text: str | None, rel: str) -> tuple[dict[str, str] | None, list[InputError]]:
    """The `labels:` of a cluster's gpus.yaml `rel` of `text` ({} when it has none); None when the file cannot be
    read or its labels break Kubernetes' rules (each reported; a file that is no YAML is the inventory's error)."""
    docs = load_documents(text, rel)[0] if text is not None else []
    if not docs or not isinstance(docs[0][1], dict):
        return None, []
    value = docs[0][1].get("labels", {})
    problems = label_problems(value, "labels")
    if problems:
        return None, [InputError(rel, docs[0][0], p.where, f"{p.where}: {p.message}", LABELS_FIX, reason="InvalidLabel")
                      for p in problems]
    return {str(k): v for k, v in value.items()}, []


def controller_paths(root: Path, generated: Iterable[str] | None, layout: Layout = SINGLE) -> tuple[str, ...]:
    """The paths under the controller's prefixes of `layout`, sorted: `generated` (git's listing) when given, else
    the directory's files there."""
    prefixes = layout.cluster_generated
    if generated is None:
        return tuple(owned_files(root, prefixes))
    return tuple(sorted(path for path in generated if path.startswith(prefixes)))


def read_last_pass(root: Path, processes: int = 1, generated: Iterable[str] | None = None,
                   committed: Committed | None = None, layout: Layout = SINGLE) -> LastPass:
    """What the last pass left: its decisions, PLAN.md, owners file, generated paths (`generated` as
    `read_repo` takes it) and rendered workers."""
    paths = controller_paths(root, generated, layout)
    records = load_decision_records(root, processes, None if generated is None else paths, committed, layout)
    return LastPass(records, read_plan_md(root, layout, committed), read_owners(root, layout), paths,
                    read_rendered_workers(root, paths, committed, layout))


def read_rightsizing(root: Path, generated: Iterable[str] | None = None, layout: Layout = SINGLE) -> Records:
    """The right-sizing records under decisions/rightsizing/<namespace>/<name>.yaml (regular files in the
    repository only, each within the limits of the controller's own files); a garbled, oversized or unreadable
    one is a RecordProblem: its model holds alone and `validate` reports it (the right-sizing pass rewrites it).
    `generated` as `read_repo` takes it."""
    under = layout.rightsizing + "/"
    listed = owned_files(root, (under,)) if generated is None else generated
    paths = [rel for rel in listed if rel.startswith(under) and rel[len(under):].count("/") == 1]
    return records_from(read_texts(root, sorted(paths), max_state_bytes()), directory=layout.rightsizing)


def read_prices(root: Path, layout: Layout = SINGLE) -> dict[str, float]:
    """gpus.yaml's pricePerGpuHour (controller.inputs.load.parse_prices); {} when it is absent or unreadable."""
    text = read_optional(root, layout.inventory)
    docs = load_documents(text, layout.inventory)[0] if text else []
    return parse_prices(docs[0][1]) if docs else {}


def read_rendered_workers(root: Path, paths: Iterable[str] | None = None,
                          committed: Committed | None = None, layout: Layout = SINGLE) -> dict[str, str]:
    """The last rendered Deployments and ConfigMaps (path -> text): which workers a pass restarts. `paths`: the
    controller's paths (`controller_paths`), listed from the directory when None; `committed`: as read_repo."""
    under = layout.rendered + "/"
    names = [rel for rel in controller_paths(root, paths, layout) if rel.startswith(under)
             and rel[len(under):].count("/") == 1 and rel.rsplit("/", 1)[1].startswith(WORKER_FILES)]
    return _texts(root, names, committed)


def _texts(root: Path, paths: list[str], committed: Committed | None, limit: int | None = None) -> dict[str, str]:
    """The UTF-8 text of each of the controller's `paths` that can be read within `limit` bytes (default: an input
    file's), from git when `committed` is given (the controller's sparse work tree does not hold them), else from
    the directory; the others are left out."""
    limit = max_file_bytes() if limit is None else limit
    if committed is None:
        return {rel: text for rel, text in read_texts(root, paths, limit).items() if isinstance(text, str)}
    return _decoded(committed.read(paths, limit))


def _decoded(contents: Mapping[str, bytes]) -> dict[str, str]:
    """Each of `contents` that is UTF-8, as text (the others left out, as read_text refuses them)."""
    texts = {}
    for rel, data in contents.items():
        try:
            texts[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def read_owners(root: Path, layout: Layout = SINGLE) -> dict[str, tuple[str, ...]]:
    """The owners file the last pass wrote (namespace/name -> its generated paths); {} when absent or garbled
    (logged: a model that fails to render this pass then keeps nothing). It grows with the fleet, so it is read
    with the limits of the controller's own files (repofiles.max_state_bytes, YamlLimits.scaled)."""
    root, owners = Path(root), layout.owners
    text = read_optional(root, owners, max_state_bytes())
    doc = _json_body(text) if text is not None else {}
    if doc is None:  # not the JSON the controller writes now (an older controller wrote YAML): the YAML reader
        docs = load_documents(text, owners, YamlLimits.from_env().scaled(STATE_FACTOR))[0]
        doc = docs[0][1] if docs else None
    if not isinstance(doc, dict) or (is_file(root, owners) and text is None):
        log.warning("%s cannot be read (too large, or not the mapping the controller writes); a model that fails "
                    "to render this pass keeps none of its objects", owners)
        return {}
    return {ref: tuple(p for p in paths if isinstance(p, str)) for ref, paths in doc.items()
            if isinstance(ref, str) and isinstance(paths, list)}


def _json_body(text: str) -> object | None:
    """The JSON after a file's leading `#` comment lines; None when it is not JSON (or nests too deep)."""
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def read_plan_md(root: Path, layout: Layout = SINGLE, committed: Committed | None = None) -> str | None:
    """The last PLAN.md of `layout`'s cluster (None when absent or unreadable): from git with `committed` (the
    controller's work tree does not hold the rendered tree), else from the directory."""
    return _texts(root, [layout.plan_md], committed, max_state_bytes()).get(layout.plan_md)


def _file_error(rel: str, exc: RepoFileError) -> InputError:
    return InputError(rel, None, "", reason=exc.reason, message=exc.message, fix=exc.fix)


@dataclass
class TreeRead:
    """What one input tree (or file) gave: the parsed values, the errors, and its last good copies.

    `last_good`: decisions/_last-good/<path> -> the text of each file that parses cleanly now (or whose
    last good copy was used); the pass writes them so a later pass can fall back on them. `held`: the
    files that are broken now and were read from their last good copy instead."""

    values: list = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)
    last_good: dict[str, str] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)

    def add(self, other: TreeRead) -> TreeRead:
        self.values += other.values
        self.errors += other.errors
        self.last_good.update(other.last_good)
        self.held += other.held
        return self


def last_good_path(rel: str, layout: Layout = SINGLE) -> str:
    """Where a pass keeps the last copy of input file `rel` that parsed without an error."""
    return f"{layout.last_good}/{rel}"


def read_input_file(root: Path, rel: str, parse: Callable[[str, str], tuple[list, list[InputError]]],
                    *, last_good: bool = True, layout: Layout = SINGLE, read: str | RepoFileError | None = None
                    ) -> TreeRead:
    """One input file through `parse(text, rel) -> (values, errors)`. A file with any error is read from
    its last good copy (under `layout`'s decisions) instead, when there is one and `last_good` is set; its errors
    are still reported. `read`: what `read_text` gave for it already (read_texts of a batch)."""
    try:
        text = read_text(root, rel) if read is None else read
        if isinstance(text, RepoFileError):
            raise text
        values, errors = parse(text, rel)
    except RepoFileError as exc:
        values, errors = [], [_file_error(rel, exc)]
    keep = last_good_path(rel, layout)
    if not errors:
        return TreeRead(values, [], {keep: text} if last_good else {})
    old = read_optional(root, keep) if last_good else None
    if old is not None:
        old_values, old_errors = parse(old, rel)
        if not old_errors:
            return TreeRead(old_values, errors, {keep: old}, [rel])
    return TreeRead(values, errors)


def documents_parser(parse: Callable[[Any, str, int], tuple[Any, list[InputError]]]
                     ) -> Callable[[str, str], tuple[list, list[InputError]]]:
    """(text, rel) -> every value `parse(doc, rel, index)` gives for the file's documents, and the errors."""
    def parse_text(text: str, rel: str) -> tuple[list, list[InputError]]:
        docs, errors = load_documents(text, rel)
        values = []
        for index, doc in docs:
            value, problems = parse(doc, rel, index)
            values += [value] if value else []
            errors += problems
        return values, errors

    return parse_text


def read_models(root: Path, processes: int = 1, *, keep_documents: bool = False, layout: Layout = SINGLE,
                elsewhere: Elsewhere | None = None, committed: Committed | None = None
                ) -> tuple[list[ElasticModel], list[InputError]]:
    """Every ElasticModel under models/** (and, with clusters/, the cluster's own clusters/<name>/models/**), not
    yet checked for duplicates (`combine` does). A broken model keeps its last good spec through its decision file
    (controller.inputs.load.revive_last_good). A large fleet's files are read in `processes` processes
    (controller.cpu), the result the same. `keep_documents`: each model carries the document it was parsed from
    (a repository with clusters/ renders it into each cluster that plans it). `elsewhere`: the cluster being read
    leaves out what is placed on other clusters only (controller.inputs.clusters.Elsewhere): the files under
    models/ that hold nothing else are not read further (read from git, those the work directory's note lists are
    not read at all: `_committed_models`), and a broken model placed elsewhere is not its error."""
    parse = _parse_model_keeping_document if keep_documents else _parse_model_document
    if elsewhere is not None:
        parse = functools.partial(_parse_model_here, parse, elsewhere)
    texts: dict[str, str | RepoFileError] = {}
    for folder in layout.models:
        if committed is not None and folder == MODELS_DIR and layout.models_in_git:
            texts.update(_committed_models(committed, folder, max_file_bytes(), elsewhere))
        else:
            texts.update(_here(read_texts(Path(root), yaml_files(Path(root), folder)), elsewhere))
    found = _parse_paths(Path(root), list(texts), parse, last_good=False, processes=processes, texts=texts)
    return found.values, found.errors


_LEFT_OUT = {"outside": unsafe_path, "not-a-file": not_a_file,  # why Checkout.contents left a file out
             "loop": lambda rel: unopenable(rel, errno.ELOOP),
             "not-a-folder": lambda rel: unopenable(rel, errno.ENOTDIR),
             "missing": lambda rel: unopenable(rel, errno.ENOENT)}


ELSEWHERE_NOTE = "models-placed-elsewhere"  # the work directory's note: blobs under models/ placed elsewhere only


def _committed_models(committed: Committed, folder: str, limit: int, elsewhere: Elsewhere | None
                      ) -> dict[str, str | RepoFileError]:
    """`committed_texts` of the YAML files under `folder` (models/); with `elsewhere`, those whose blob the work
    directory's note lists as placed on other clusters only are not read at all (`Elsewhere.file` judged that
    blob so before, under the same clusters, labels, limits and code: `_note_key`), and the note is kept to what
    holds now: what this read leaves out, and what `Elsewhere.file` says of each file read."""
    listed = committed.files(folder)
    paths = [rel for rel, kind in listed.items() if rel.endswith(YAML_SUFFIXES) or kind == "unsafe"]
    if elsewhere is None:
        return committed_texts(committed, paths, limit)
    ids, key = committed.blob_ids(paths), _note_key(elsewhere, limit)
    known = committed.remembered(ELSEWHERE_NOTE, key)
    texts = _here(committed_texts(committed, [rel for rel in paths if ids.get(rel) not in known], limit), elsewhere)
    committed.remember(ELSEWHERE_NOTE, key, {object_id for rel, object_id in ids.items() if rel not in texts})
    return texts


def _here(texts: dict[str, str | RepoFileError], elsewhere: Elsewhere | None) -> dict[str, str | RepoFileError]:
    """`texts` but the files `elsewhere` holds placed on other clusters only (looked at before the files are
    shared out to the processes that parse them: the others' files are never sent)."""
    if elsewhere is None:
        return texts
    return {rel: text for rel, text in texts.items() if not isinstance(text, str) or not elsewhere.file(rel, text)}


def _note_key(elsewhere: Elsewhere, limit: int) -> str:
    """What a verdict of `elsewhere` on a blob depends on besides its content: the code and schemas that judge it,
    the cluster, every cluster's labels, the YAML limits and the file size limit (a digest)."""
    facts = json.dumps([_judging_code(), elsewhere.facts(), limit], sort_keys=True)
    return hashlib.sha256(facts.encode()).hexdigest()


@functools.cache
def _judging_code() -> str:
    """A digest of the sources whose rules `Elsewhere.file` applies (the reader's package, the placement and model
    types, the shared contract, the schemas, the YAML and schema libraries' versions): a note that other code kept is
    never trusted."""
    digest = hashlib.sha256()
    for package in (Path(__file__).parent, Path(schemas.__file__).parent, Path(wire.__file__).parent):
        for path in sorted(package.iterdir()):
            if path.suffix in (".py", ".json"):
                digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for module in (placement_rules, model_types):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(f"PyYAML {yaml.__version__}, jsonschema {metadata.version('jsonschema')}".encode())
    return digest.hexdigest()


def committed_texts(committed: Committed, paths: Iterable[str], limit: int) -> dict[str, str | RepoFileError]:
    """The files `paths` (listed by `committed.files`) as `read_texts` gives them from a work tree, from git
    instead: rel -> its text, or the RepoFileError reading it from the work tree would raise (a symlink out of the
    repository, no regular file, more than `limit` bytes, not UTF-8)."""
    texts: dict[str, str | RepoFileError] = {}
    for rel, found in committed.contents(paths, limit).items():
        try:
            if isinstance(found, bytes):
                texts[rel] = decoded(rel, found)
            else:
                raise too_large(rel, limit, found) if isinstance(found, int) else _LEFT_OUT.get(found, not_a_file)(rel)
        except RepoFileError as exc:
            texts[rel] = exc
    return texts


def _parse_model_here(parse: Callable[[Any, str, int], tuple[ElasticModel | None, list[InputError]]],
                      elsewhere: Elsewhere, doc: Any, rel: str, index: int
                      ) -> tuple[ElasticModel | None, list[InputError]]:
    model, errors = parse(doc, rel, index)
    if errors and rel.startswith(MODELS_DIR + "/") and elsewhere.document(doc):
        return None, []  # a broken model of other clusters: theirs to report
    return model, errors


def _parse_model_document(doc: Any, rel: str, index: int) -> tuple[ElasticModel | None, list[InputError]]:
    return parse_model(doc, Source(rel, index))


def _parse_model_keeping_document(doc: Any, rel: str, index: int) -> tuple[ElasticModel | None, list[InputError]]:
    return parse_model(doc, Source(rel, index), keep_document=True)


def read_profiles(root: Path) -> tuple[list[Profile], list[InputError]]:
    """Every profile under profiles/**, not yet checked for duplicates (`combine` does). Cluster mode adds
    the profiles it finds in ConfigMaps to these before combining."""
    found = read_profile_tree(root)
    return found.values, found.errors


def read_profile_tree(root: Path) -> TreeRead:
    """profiles/**, each broken file read from its last good copy."""
    return _parse_tree(Path(root), PROFILES_DIR, parse_profile)


def read_profile_trees(root: Path, layout: Layout, catalog: Catalog | None) -> tuple[TreeRead, tuple[Profile, ...]]:
    """(profiles/** as `layout`'s cluster reads them, the profiles other clusters measured). In the single-cluster
    layout the first is profiles/** whole and the second empty; with clusters/, the first leaves out every other
    cluster's profiles/measured/<cluster>/ (their files, not this cluster's to keep), which come second: one per
    (model, revision, GPU product), the first cluster by name winning, used where this cluster has no measured
    profile of its own (Tree.combined)."""
    paths = yaml_files(Path(root), PROFILES_DIR)
    others = {} if catalog is None else {name: f"{MEASURED_PROFILES_DIR}/{name}/" for name in catalog.names
                                         if name != layout.cluster}
    foreign = tuple(others.values())
    own = _parse_paths(Path(root), [p for p in paths if not p.startswith(foreign)] if foreign else paths,
                       parse_profile, last_good=True, layout=layout)
    shared: dict[tuple[str, str, str], Profile] = {}
    for name, under in sorted(others.items()):
        for profile in _parse_paths(Path(root), [p for p in paths if p.startswith(under)], parse_profile,
                                    last_good=False).values:
            if profile.source == "measured":
                shared.setdefault(profile.key, profile)
    return own, tuple(shared.values())


PARALLEL_MIN_BYTES = 1 << 20  # below this, one process reads a tree faster than several start


def _parse_tree(root: Path, sub: str, parse: Callable, *, last_good: bool = True, processes: int = 1,
                layout: Layout = SINGLE) -> TreeRead:
    """Every file under `sub`, in path order; in `processes` processes when the files hold PARALLEL_MIN_BYTES."""
    return _parse_paths(root, yaml_files(root, sub), parse, last_good=last_good, processes=processes, layout=layout)


def _parse_paths(root: Path, paths: list[str], parse: Callable, *, last_good: bool = True, processes: int = 1,
                 layout: Layout = SINGLE, texts: Mapping[str, str | RepoFileError] | None = None) -> TreeRead:
    """Every one of `paths`, in order; in `processes` processes when the files hold PARALLEL_MIN_BYTES. `texts`: what
    reading each gave already (read_texts, or git's)."""
    size = _size(root, paths) if texts is None else sum(len(t) for t in texts.values() if isinstance(t, str))
    wide = processes > 1 and len(paths) > 1 and size >= PARALLEL_MIN_BYTES
    parts = forked_map(_parse_files, [(root, run, parse, last_good, layout, texts)
                                      for run in runs(paths, processes if wide else 1)])
    found = TreeRead()
    for part in parts:
        found.add(part)
    return found


def _parse_files(root: Path, paths: list[str], parse: Callable, last_good: bool, layout: Layout,
                 texts: Mapping[str, str | RepoFileError] | None = None) -> TreeRead:
    found, parse_text = TreeRead(), documents_parser(parse)
    read = read_texts(root, paths) if texts is None else {rel: texts[rel] for rel in paths}
    for rel, text in read.items():
        found.add(read_input_file(root, rel, parse_text, last_good=last_good, layout=layout, read=text))
    return found


def _size(root: Path, paths: list[str]) -> int:
    total = 0
    for rel in paths:
        try:
            total += os.lstat(Path(root) / rel).st_size
        except OSError:
            pass  # read_input_file reports it
    return total


def read_inventory(root: Path, layout: Layout = SINGLE) -> TreeRead:
    """gpus.yaml's Inventory, its one value (none when the file is absent), from its last good copy while it is
    broken; with clusters/, the cluster's own clusters/<name>/gpus.yaml."""
    if not is_file(root, layout.inventory):
        return TreeRead()
    return read_input_file(Path(root), layout.inventory, parse_inventory_text, layout=layout)


def parse_inventory_text(text: str, rel: str) -> tuple[list[Inventory], list[InputError]]:
    """The Inventory of one GPUInventory file's text (its first document); `rel` only names it in errors."""
    docs, errors = load_documents(text, rel)
    if not docs:  # an empty or truncated file is no inventory of zero GPUs: that is `nodes: []`
        return [], errors or [InputError(rel, None, "", reason="EmptyInventory",
                                         message=f"{rel} holds no document, so it lists no GPU",
                                         fix="restore its nodes; to plan onto no GPU at all, write a GPUInventory "
                                             "with `nodes: []`")]
    (first, doc), extra = docs[0], docs[1:]
    inventory, errors_here = parse_gpu_inventory(doc, rel, first)
    return [inventory], errors + errors_here + [_extra_inventory(rel, index) for index, _ in extra]


def _extra_inventory(file: str, document: int) -> InputError:
    return InputError(file, document, "", reason="ExtraDocument",
                      message=f"{file} holds one GPUInventory; this further document is ignored",
                      fix="merge its nodes into the first document's nodes list")


@dataclass(frozen=True)
class RepoCompositions:
    """The compositions a pass uses (shipped, then the repository's by name) and what reading them gave."""

    compositions: Mapping[str, Composition]
    read: TreeRead


def read_compositions(root: Path, layout: Layout = SINGLE) -> RepoCompositions:
    """compositions/*.yaml of the GitOps repository over the shipped ones. Two repository files naming one
    composition are an error on each, and neither is used (the shipped one of that name stays)."""
    read = TreeRead()
    for rel in yaml_files(Path(root), COMPOSITIONS_DIR):
        read.add(read_input_file(Path(root), rel, documents_parser(parse_composition), layout=layout))
    by_name: dict[str, list[Composition]] = defaultdict(list)
    for composition in read.values:
        by_name[composition.name].append(composition)
    found = dict(shipped_compositions())
    for name, group in sorted(by_name.items()):
        if len(group) == 1:
            found[name] = group[0]
            continue
        where = sorted(str(c.source) for c in group)
        read.errors += [InputError(rel, None, "metadata.name", reason="DuplicateComposition",
                                   message=f"composition {name!r} is defined in {', '.join(where)}; none of them "
                                           "is used", fix="keep one file per composition name")
                        for rel in where]
    return RepoCompositions(MappingProxyType(found), read)


PARALLEL_MIN_RECORDS = 2000  # below this, one process reads the decision records faster than several start


def load_decision_records(root: Path, processes: int = 1, generated: Iterable[str] | None = None,
                          committed: Committed | None = None, layout: Layout = SINGLE
                          ) -> dict[tuple[str, str], DecisionRecord]:
    """decisions/<ns>/<name>.yaml as compose wrote them (not the last good copies or the right-sizing records);
    unreadable or garbled files are skipped (the controller owns them and rewrites them on its next pass). A
    large fleet's records are read in `processes` processes (controller.cpu), the result the same.
    `generated`: the controller's paths, sorted (`controller_paths`); None: listed from the directory.
    `committed`: read from git (as read_repo takes it); None: from the directory."""
    listed = yaml_files(Path(root), layout.decisions) if generated is None else [
        rel for rel in generated if rel.startswith(layout.decisions + "/") and rel.endswith(YAML_SUFFIXES)]
    paths = [rel for rel in listed if not rel.startswith((layout.last_good + "/", layout.rightsizing + "/"))]
    texts = None if committed is None else _texts(root, paths, committed)
    parts = processes if len(paths) >= PARALLEL_MIN_RECORDS else 1
    records: dict[tuple[str, str], DecisionRecord] = {}
    for part in forked_map(_records_of, [(root, run, texts) for run in runs(paths, parts)]):
        records.update(part)  # in path order, as one process reads them
    return records


def _records_of(root: Path, paths: list[str], texts: Mapping[str, str] | None
                ) -> dict[tuple[str, str], DecisionRecord]:
    records = {}
    limits = YamlLimits.from_env()
    found = read_texts(root, paths) if texts is None else {rel: texts[rel] for rel in paths if rel in texts}
    for rel, text in found.items():
        if isinstance(text, RepoFileError):
            continue
        try:
            (_, doc), = load_documents(text, rel, limits)[0]
            decision = decision_from_dict(doc["status"]["assigned"])
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        spec_doc = {k: v for k, v in doc.items() if k != "status"}
        source = ((doc.get("metadata") or {}).get("annotations") or {}).get(SOURCE_ANNOTATION, "")
        model, problems = parse_model(spec_doc, Source(source or rel))
        records[decision.key] = DecisionRecord(decision, None if problems else model)
    return records
