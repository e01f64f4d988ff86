"""Every input file the right-sizing command reads is read as bytes and decoded with a clear error: the file, the
line, and no raw control character echoed. Hypothesis feeds arbitrary bytes to the usage reader, the record reader
and the command itself: nothing raises past the command's error handler. A non-UTF-8 byte in a model name crashed
`gpushare rightsize --repo ... --usage FILE` with a UnicodeDecodeError traceback."""
from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.cli.commands import main
from controller.inputs.reader import read_rightsizing
from controller.inputs.rightsizing_records import Record, records_from
from controller.rightsizing.usage import MAX_LINE_BYTES, UsageFormatError, lines_of, read_samples

GOOD = b'{"time":1,"model":"llm/chat","deviceBytes":5}\n'
RECORD = Record("llm", "chat", "Auto", 4 << 30, 2 << 30, "down", "BelowTarget", "2027-01-15T08:00:00Z").dump()
MODEL = ("apiVersion: gpushare.dev/v1alpha1\nkind: ElasticModel\nmetadata:\n  name: chat\n  namespace: llm\nspec:\n"
         "  model: org/chat\n  memoryBudget: 4Gi\n  rightsizing:\n    policy: Auto\n")


def _printable(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


def _read(data: bytes, origin: str = "usage.jsonl"):
    try:
        return read_samples(lines_of(io.BytesIO(data)), origin)
    except UsageFormatError as exc:
        return exc


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_any_bytes_are_samples_or_an_error_naming_the_line(data):
    got = _read(data)
    if isinstance(got, UsageFormatError):
        message = str(got)
        assert message.startswith("usage.jsonl:") and _printable(message) and len(message) < 500
        assert int(message.split(":")[1]) >= 1


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(0, 40))
def test_bytes_inside_a_good_line_are_named_by_line_and_column(junk, where):
    bad = GOOD[:where] + junk + GOOD[where:]
    got = _read(GOOD + GOOD + bad + GOOD)
    if isinstance(got, UsageFormatError):
        assert str(got).startswith("usage.jsonl:3: ") and _printable(str(got))


def test_a_non_utf8_byte_in_a_model_name_is_an_error_with_its_line_column_and_value():
    got = _read(GOOD + b'{"time":2,"model":"llm/ch\xffat","deviceBytes":5}\n')
    assert str(got) == "usage.jsonl:2: not UTF-8 text: byte 0xff at column 26; save the file as UTF-8"


def test_a_line_longer_than_the_limit_is_refused_and_the_next_line_is_read_as_its_own():
    long = b'{"time":2,"model":"llm/chat","deviceBytes":5,"x":"' + b"a" * MAX_LINE_BYTES + b'"}\n'
    assert str(_read(GOOD + long + GOOD)).startswith("usage.jsonl:2: longer than 65536 bytes")
    assert [len(line or b"") for line in lines_of(io.BytesIO(GOOD + long + GOOD))] == [len(GOOD), 0, len(GOOD)]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048))
def test_any_bytes_at_a_records_path_are_a_record_or_that_models_problem(data):
    path = "decisions/rightsizing/llm/chat.yaml"
    records = records_from({path: data})
    assert len(records) + len(records.problems) == 1
    for problem in records.problems:
        assert problem.key == ("llm", "chat") and problem.message and _printable(problem.message)


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=16), st.integers(0, len(RECORD)))
def test_bytes_inside_a_good_record_never_raise(junk, where):
    data = RECORD.encode()[:where] + junk + RECORD.encode()[where:]
    records = records_from({"decisions/rightsizing/llm/chat.yaml": data})
    assert len(records) + len(records.problems) == 1


def test_a_record_that_is_not_utf8_says_where_from_the_work_tree_too(tmp_path):
    path = tmp_path / "decisions" / "rightsizing" / "llm" / "chat.yaml"
    path.parent.mkdir(parents=True)
    path.write_bytes(RECORD.encode().replace(b"BelowTarget", b"Below\xc3Target"))
    (problem,) = read_rightsizing(tmp_path).problems
    assert problem.key == ("llm", "chat") and "not UTF-8 text: byte 0xc3 at line" in problem.message


def _repo(root: Path) -> Path:
    (root / "models").mkdir(parents=True)
    (root / "models" / "chat.yaml").write_text(MODEL)
    return root


def test_rightsize_names_the_line_of_a_non_utf8_model_name_and_exits_1(tmp_path, capsys):
    repo = _repo(tmp_path / "repo")
    usage = tmp_path / "usage\x1b[2J.jsonl"
    usage.write_bytes(GOOD + GOOD + b'{"time":3,"model":"llm/\xffchat\x1b[31m","deviceBytes":5}\n')
    assert main(["rightsize", "--repo", str(repo), "--usage", str(usage)]) == 1
    err = capsys.readouterr().err
    assert err == (f"gpushare: cannot read usage: {tmp_path}/usage\\x1b[2J.jsonl:3: not UTF-8 text: byte 0xff at "
                   "column 24; save the file as UTF-8\n")


def test_rightsize_reads_standard_input_as_bytes(tmp_path, capsys, monkeypatch):
    repo = _repo(tmp_path / "repo")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(GOOD + b'{"time":2,"model":"llm/\xfe"}\n')))
    assert main(["rightsize", "--repo", str(repo), "--usage", "-"]) == 1
    assert "<stdin>:2: not UTF-8 text: byte 0xfe at column 24" in capsys.readouterr().err


def test_rightsize_and_validate_carry_on_past_a_record_that_is_not_utf8(tmp_path, capsys):
    repo = _repo(tmp_path / "repo")
    record = repo / "decisions" / "rightsizing" / "llm" / "chat.yaml"
    record.parent.mkdir(parents=True)
    record.write_bytes(b"\xff\xfe" + RECORD.encode())
    usage = tmp_path / "usage.jsonl"
    usage.write_bytes(GOOD)
    assert main(["rightsize", "--repo", str(repo), "--usage", str(usage)]) == 0
    assert main(["validate", str(repo)]) == 1
    out = capsys.readouterr().out
    assert "[InvalidRecord] decisions/rightsizing/llm/chat.yaml is not UTF-8 text: byte 0xff at line 1, column 1" in out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=1024))
def test_the_command_never_raises_whatever_the_usage_files_bytes(data):
    with tempfile.TemporaryDirectory() as scratch:
        repo = _repo(Path(scratch) / "repo")
        usage = Path(scratch) / "usage.jsonl"
        usage.write_bytes(data)
        assert main(["rightsize", "--repo", str(repo), "--usage", str(usage)]) in (0, 1)
