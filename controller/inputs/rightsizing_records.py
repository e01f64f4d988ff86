"""Right-sizing records: decisions/rightsizing/<namespace>/<name>.yaml, owned by the controller.

A record says what the loop last concluded for one model: the budget it applied
(Auto: the effective budget) or proposed (Recommend: the budget on the review
branch), the user's budget it started from, the evidence, where the new budget fits,
the KV-cache reservation it recommends, and the loop's conditions (UsageAvailable,
NeedsCapacity, AtMaxBudget; the status writes them into status.conditions). Auto never edits
a user file: the next pass plans the model with the effective budget while the user's
spec.memoryBudget is the one the record started from (a budget the user changes wins).
Records are untrusted when read back (a hand edit, a bad merge): `records_from` parses each with the
YAML limits (controller.inputs.yamlin) and checks it against schemas/rightsizing-record.schema.json;
a file that fails is a `RecordProblem` (InvalidRecord, what and where), so its model holds alone
(the step says so and rewrites the record; no effective budget applies meanwhile) and `gpushare
validate` reports it. Called by the right-sizing step (writes), the reader (reads) and PLAN.md's section.
Read by controller.inputs.reader (`records_from` over the texts it read within its limits), written by
the right-sizing step (controller.rightsizing), listed by PLAN.md's section.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

import yaml
from jsonschema.exceptions import best_match

from contract.wire import API_VERSION
from controller.inputs.layout import RIGHTSIZING_DIR as RECORDS_DIR
from controller.inputs.repofiles import RepoFileError
from controller.inputs.utf8 import NotUtf8, decode_utf8
from controller.inputs.yamlin import YamlLimits, parse_documents
from controller.types import ElasticModel, InputError
from schemas import validator

RECORDS_BRANCH = "gpushare/rightsizing"  # the records' review branch when the controller writes back for review


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str

    def as_dict(self) -> dict:
        return {"type": self.type, "status": self.status, "reason": self.reason, "message": self.message}


@dataclass(frozen=True)
class Record:
    namespace: str
    name: str
    policy: str
    spec_budget_bytes: int
    budget_bytes: int
    direction: str | None = None
    reason: str | None = None
    at: str | None = None
    evidence: dict = field(default_factory=dict)
    fit: dict = field(default_factory=dict)
    review_branch: str | None = None
    conditions: tuple[Condition, ...] = ()
    kv: dict = field(default_factory=dict)  # the recommended KV reservation (controller.rightsizing.kv)
    recent: tuple[str, ...] = ()  # the times of the changes in the last day (the cap, MAX_CHANGES_PER_DAY)
    directory: str = field(default=RECORDS_DIR, compare=False)  # where it is filed: a cluster's own records folder

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def path(self) -> str:
        return f"{self.directory}/{self.namespace}/{self.name}.yaml"

    @property
    def open(self) -> bool:
        """A budget other than the user's awaits review (Recommend) or is in force (Auto)."""
        return self.budget_bytes != self.spec_budget_bytes

    @property
    def kv_differs(self) -> bool:
        """The recommended KV reservation is not the one the worker holds now."""
        return bool(self.kv) and self.kv.get("change") != "keep"

    def recommendation(self) -> dict | None:
        """The open recommendation for status.rightsizing.recommendation: a budget other than the user's (Auto:
        in force; Recommend: on its review branch) or a KV reservation other than the worker's; None when none."""
        if not (self.open or self.kv_differs):
            return None
        out: dict = {}
        if self.open:
            out.update(budgetBytes=self.budget_bytes, direction=self.direction, reason=self.reason, at=self.at,
                       reviewBranch=self.review_branch, fit=(self.fit or {}).get("kind"))
        if self.kv_differs:
            out.update(kvReservationBytes=self.kv["recommendedBytes"], kvSequences=self.kv["sequences"])
        return {k: v for k, v in out.items() if v is not None}

    def as_dict(self) -> dict:
        doc = {"apiVersion": API_VERSION, "kind": "RightsizingRecord",
               "model": {"namespace": self.namespace, "name": self.name}, "policy": self.policy,
               "specBudgetBytes": self.spec_budget_bytes, "budgetBytes": self.budget_bytes}
        for key, value in (("direction", self.direction), ("reason", self.reason), ("at", self.at),
                           ("reviewBranch", self.review_branch)):
            if value is not None:
                doc[key] = value
        if self.evidence:
            doc["evidence"] = self.evidence
        if self.fit:
            doc["fit"] = self.fit
        if self.kv:
            doc["kvReservation"] = self.kv
        if self.recent:
            doc["recentChanges"] = list(self.recent)
        if self.conditions:
            doc["conditions"] = [c.as_dict() for c in self.conditions]
        return doc

    def dump(self) -> str:
        return yaml.safe_dump(self.as_dict(), sort_keys=False, default_flow_style=False, width=1000)


@dataclass(frozen=True)
class RecordProblem:
    """A file under decisions/rightsizing/ that is not a valid record for the model its path names."""

    path: str
    key: tuple[str, str] | None  # (namespace, name) from the path, when it has that shape
    message: str

    def as_input_error(self) -> InputError:
        return InputError(file=self.path, document=None, path="", reason="InvalidRecord", message=self.message,
                          fix="delete the file or restore it from git: the controller rewrites it on its next "
                              "right-sizing pass; the model holds until then")


class Records(dict):
    """(namespace, name) -> Record, with `problems`: the files that were not valid records."""

    def __init__(self, records=(), problems: Iterable[RecordProblem] = ()) -> None:
        super().__init__(records)
        self.problems = tuple(problems)

    def problem_of(self, key: tuple[str, str]) -> RecordProblem | None:
        return next((p for p in self.problems if p.key == key), None)


def parse_record(doc) -> Record | None:
    """A record from its schema-valid document; None for anything else."""
    try:
        if doc.get("kind") != "RightsizingRecord":
            return None
        return Record(
            namespace=str(doc["model"]["namespace"]), name=str(doc["model"]["name"]), policy=str(doc["policy"]),
            spec_budget_bytes=int(doc["specBudgetBytes"]), budget_bytes=int(doc["budgetBytes"]),
            direction=doc.get("direction"), reason=doc.get("reason"), at=doc.get("at"),
            evidence=dict(doc.get("evidence") or {}), fit=dict(doc.get("fit") or {}),
            review_branch=doc.get("reviewBranch"), kv=dict(doc.get("kvReservation") or {}),
            recent=tuple(str(t) for t in doc.get("recentChanges") or ()),
            conditions=tuple(Condition(**c) for c in doc.get("conditions") or ()))
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def records_from(texts: Mapping[str, str | bytes | RepoFileError], limits: YamlLimits | None = None, *,
                 directory: str = RECORDS_DIR) -> Records:
    """Records from their files (repository path -> the text, the bytes read from git, or why the file could not
    be read), each decoded as UTF-8, parsed within the YAML limits and checked against the record schema; a file
    that is not one valid record at its own path (`<directory>/<namespace>/<name>.yaml`; `directory` a cluster's
    decisions/<cluster>/rightsizing with clusters/) is a RecordProblem instead, whatever its bytes."""
    limits = limits or YamlLimits.from_env()
    records, problems = {}, []
    for rel, text in sorted(texts.items()):
        record_or_problem = _parse_file(rel, text, limits, directory)
        if isinstance(record_or_problem, RecordProblem):
            problems.append(record_or_problem)
        else:
            records[record_or_problem.key] = record_or_problem
    return Records(records, problems)


def _parse_file(rel: str, data: str | bytes | RepoFileError, limits: YamlLimits, directory: str
                ) -> Record | RecordProblem:
    if isinstance(data, RepoFileError):
        return RecordProblem(rel, _key_of(rel, directory), f"{data.message}: {data.fix}")
    if isinstance(data, bytes):
        try:
            data = decode_utf8(data)
        except NotUtf8 as exc:
            return RecordProblem(rel, _key_of(rel, directory), f"{exc}; a record is UTF-8 YAML")
    return parse_record_text(rel, data, limits, directory)


def _key_of(rel: str, directory: str) -> tuple[str, str] | None:
    """(namespace, name) of a record's path, when it has the shape <directory>/<namespace>/<name>.yaml."""
    parts = rel.removeprefix(directory + "/").removesuffix(".yaml").split("/")
    return (parts[0], parts[1]) if len(parts) == 2 and rel.endswith(".yaml") else None


def parse_record_text(rel: str, text: str, limits: YamlLimits, directory: str = RECORDS_DIR) -> Record | RecordProblem:
    """One record file, pure: its Record, or what is wrong with it."""
    key = _key_of(rel, directory)
    try:
        docs = parse_documents(text, unique_keys=True, limits=limits)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        problem = getattr(exc, "problem", None) or "not YAML"
        return RecordProblem(rel, key, f"{str(problem)[:200]}")
    if len(docs) != 1:
        return RecordProblem(rel, key, f"holds {len(docs)} YAML documents; a record is exactly one")
    error = best_match(validator("rightsizing-record").iter_errors(docs[0]))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(the document)"
        return RecordProblem(rel, key, f"{where}: {error.message[:300]}")
    record = parse_record(docs[0])
    record = None if record is None else replace(record, directory=directory)
    if record is None or rel != record.path:
        return RecordProblem(rel, key, f"the record's model does not match its path "
                                       f"({directory}/<namespace>/<name>.yaml)")
    return record


def observed_models(models: Iterable[ElasticModel], records: Mapping[tuple[str, str], Record]
                    ) -> tuple[ElasticModel, ...]:
    """Models under a policy with their record's conditions and open recommendation (what their status shows);
    budgets untouched. Cluster mode also applies the records awaiting review on their own branch, so the status
    says what the loop last saw (a hold included) before that branch is merged."""
    out = []
    for model in models:
        record = records.get(model.key)
        if record is not None and model.rightsizing.enabled:
            model = replace(model, rightsizing_conditions=tuple(c.as_dict() for c in record.conditions),
                            rightsizing_recommendation=record.recommendation())
        out.append(model)
    return tuple(out)


def effective_models(models: Iterable[ElasticModel], records: dict[tuple[str, str], Record]) -> tuple[ElasticModel, ...]:
    """Models with Auto's effective budget where a record applies: policy Auto now, and the user's budget is
    still the one the record started from; clamped to the policy's current [minBudget, maxBudget]. Every model
    under a policy carries its record's conditions (UsageAvailable, NeedsCapacity, AtMaxBudget) and open
    recommendation for its status."""
    out = []
    for model in observed_models(models, records):
        record = records.get(model.key)
        if (record is not None and model.rightsizing.policy == "Auto" and record.policy == "Auto"
                and model.user_budget_bytes is None and record.spec_budget_bytes == model.budget_bytes):
            model = replace(model, budget_bytes=model.rightsizing.clamp(record.budget_bytes),
                            user_budget_bytes=model.budget_bytes)
        out.append(model)
    return tuple(out)
