"""Records read back are untrusted: each within the YAML limits and the record schema; a bad one holds its model
only (the step says InvalidRecord and rewrites it) and `gpushare validate` reports it."""
from __future__ import annotations

from dataclasses import replace

import pytest

from controller.inputs.rightsizing_records import Record, records_from
from controller.rightsizing.step import step
from controller.rightsizing.usage import Sample

GiB = 1 << 30
GOOD = Record("llm", "chat", "Auto", 4 * GiB, 5 * GiB, "up", "OutOfMemory", "2026-12-01T00:00:00Z",
              {"peakBytes": 3 * GiB, "breaches": ["OutOfMemory"]}).dump()
KV = ("kvReservation: {recommendedBytes: 1, sequences: 1, contextTokens: 1, reservedBytes: 1, "
      "reservedContextTokens: 1, floorBytes: 1, floor: x, change: keep}\n")
BAD = [  # (id, text)
    ("infinity-budget", GOOD.replace(f"budgetBytes: {5 * GiB}", "budgetBytes: .inf")),
    ("negative-budget", GOOD.replace(f"budgetBytes: {5 * GiB}", "budgetBytes: -1")),
    ("beyond-int64", GOOD.replace(f"budgetBytes: {5 * GiB}", f"budgetBytes: {2 ** 64}")),
    ("incomplete-kv-reservation", GOOD + "kvReservation: {recommendedBytes: 5}\n"),
    ("kv-reservation-wrong-type", GOOD + KV.replace("sequences: 1", "sequences: many")),
    ("alias-bomb", "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,"
     "*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,"
     "*e,*e,*e,*e]\n"),
    ("two-documents", GOOD + "---\n" + GOOD),
    ("not-yaml", "policy: [\n"),
    ("unknown-field", GOOD + "surprise: 1\n"),
    ("condition-missing-message", GOOD + "conditions: [{type: A, status: 'True', reason: B}]\n"),
    ("wrong-model-for-path", GOOD.replace("name: chat", "name: other")),
    ("duplicate-key", GOOD + f"budgetBytes: {GiB}\n"),
]


@pytest.mark.parametrize("case,text", BAD, ids=[c[0] for c in BAD])
def test_a_bad_record_is_a_problem_for_its_model_only(case, text):
    other = Record("llm", "other", "Auto", 4 * GiB, 6 * GiB).dump()
    records = records_from({"decisions/rightsizing/llm/chat.yaml": text,
                            "decisions/rightsizing/llm/other.yaml": other})
    assert set(records) == {("llm", "other")}
    (problem,) = records.problems
    assert problem.key == ("llm", "chat") and problem.message
    assert problem.as_input_error().reason == "InvalidRecord"


def test_a_good_record_with_every_field_round_trips():
    text = GOOD + KV + "recentChanges: ['2026-12-01T00:00:00Z']\nconditions: [{type: A, status: 'True', reason: B, message: m}]\n"
    records = records_from({"decisions/rightsizing/llm/chat.yaml": text})
    assert not records.problems and records[("llm", "chat")].recent == ("2026-12-01T00:00:00Z",)


def test_the_step_holds_the_model_whose_record_is_bad_and_acts_for_the_others():
    from factories import toy_model
    from controller.policy import Rightsizing
    policy = Rightsizing(policy="Auto", upsize_after_s=60)
    models = [replace(toy_model(name, 4 * GiB), rightsizing=policy) for name in ("chat", "other")]
    usage = {f"llm/{n}": [Sample(time=60.0 * i, model=f"llm/{n}", device_bytes=GiB, ooms=int(i == 5))
                          for i in range(10)] for n in ("chat", "other")}
    result = step(models, (), [], {}, usage, 600.0, bad_records={("llm", "chat"): "budgetBytes: not an integer"})
    chat, other = result.records[("llm", "chat")], result.records[("llm", "other")]
    assert chat.budget_bytes == 4 * GiB and chat.conditions[0].reason == "InvalidRecord"
    assert other.direction == "up"
    assert not records_from({chat.path: chat.dump()}).problems  # the rewritten record is valid


def test_validate_reports_a_bad_record_and_exits_1(tmp_path, capsys):
    from controller.cli.commands import main
    from tests.conftest import REPO_ROOT
    import shutil
    repo = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "examples" / "fleet", repo) if (REPO_ROOT / "examples" / "fleet").is_dir() \
        else pytest.skip("no example fleet")
    bad = repo / "decisions" / "rightsizing" / "llm" / "chat.yaml"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text(BAD[0][1])
    assert main(["validate", str(repo)]) == 1
    assert "InvalidRecord" in capsys.readouterr().out
