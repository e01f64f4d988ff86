"""The usage series the recommender reads: one JSON object per line, one line per model per sample.

Owns the format (docs/guide.md, "Right-sizing", documents it), reading it with
per-line errors and writing it canonically. A file is read as bytes, a line at a time (at most
MAX_LINE_BYTES each), and each line decoded as strict UTF-8 (controller.inputs.utf8): whatever its
bytes, a bad line is a UsageFormatError naming the file and the line, never a traceback. `gpushare usage export` writes it from
Prometheus; `gpushare rightsize --usage FILE` and the controller read it. A line:

    {"time": "2026-11-30T12:00:15Z", "model": "llm/chat-small", "deviceBytes": 1503238553,
     "kvUsedBytes": 50331648, "kvReservedBytes": 201326592, "queueWaitSeconds": 0.004,
     "ttftSeconds": 0.12, "tpotSeconds": 0.018, "refusals": 0, "ooms": 0, "missingBytes": 0}

`time` (RFC 3339 UTC, or Unix seconds) and `model` (namespace/name) are required. Every
other field is optional and may be null; a line without `deviceBytes` is *missing data*,
and the recommender makes no change on missing data. `deviceBytes` is the most the model
held on the device in the interval: weights, buffers and its KV-cache and activation
reservations (`gpushare_worker_device_bytes`); `kvUsedBytes` the most KV cache its running
sequences held, against `kvReservedBytes`. Latencies are the sample interval's 95th
percentile; `refusals`/`ooms` count worker refusals and out-of-memory failures in the
interval, `missingBytes` the largest shortfall a refusal reported, `budgetBytes` the budget the
worker ran with (a breach under a budget older than the loop's last upsize is not acted on).
Every number must be finite, at least 0 and at most its LIMITS entry (no GPU holds a pebibyte,
no latency is a day): a value beyond is an error here and holds the model when Prometheus sends
it (controller.rightsizing.prometheus). Errors name the line and never echo a control character.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from controller.inputs.utf8 import NotUtf8, decode_utf8

_NUMBERS = {"deviceBytes": "device_bytes", "kvUsedBytes": "kv_used_bytes", "kvReservedBytes": "kv_reserved_bytes",
            "queueWaitSeconds": "queue_wait_s", "ttftSeconds": "ttft_s", "tpotSeconds": "tpot_s",
            "refusals": "refusals", "ooms": "ooms", "missingBytes": "missing_bytes", "budgetBytes": "budget_bytes"}


MAX_USAGE_BYTES = 1 << 50       # 1 PiB: no device holds more; beyond is a broken exporter
MAX_USAGE_SECONDS = 86400.0     # a latency of a day is no measurement
MAX_USAGE_COUNT = 1e9           # refusals or OOMs in one interval
LIMITS = {key: MAX_USAGE_BYTES if key.endswith("Bytes") else MAX_USAGE_SECONDS if key.endswith("Seconds")
          else MAX_USAGE_COUNT for key in _NUMBERS}
_LIMIT_WORDS = {MAX_USAGE_BYTES: "2^50 (1 PiB)", MAX_USAGE_SECONDS: "86400 (a day)", MAX_USAGE_COUNT: "10^9"}
MAX_TIME = 1 << 34              # Unix seconds (year 2514): later is no clock
MAX_LINE_BYTES = 1 << 16        # a sample is a few hundred bytes; a longer line is no sample


class UsageFormatError(ValueError):
    reason = "InvalidUsage"


@dataclass(frozen=True, slots=True)  # a window holds one per model per grid step: no __dict__ each
class Sample:
    time: float   # Unix seconds
    model: str    # namespace/name
    device_bytes: int | None = None
    kv_used_bytes: int | None = None
    kv_reserved_bytes: int | None = None
    queue_wait_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    refusals: int | None = None
    ooms: int | None = None
    missing_bytes: int | None = None
    budget_bytes: int | None = None  # the budget the worker ran with
    kv_used_least_bytes: int | None = None  # a slot's peak (a pass's history): its least KV in use; not in the format

    @property
    def missing(self) -> bool:
        """No usage at this time: the recommender holds."""
        return self.device_bytes is None


def parse_time(value) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and 0 <= value < MAX_TIME:
        return float(value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            if parsed.tzinfo is not None and 0 <= parsed.timestamp() < MAX_TIME:
                return parsed.timestamp()
    raise UsageFormatError(f"time {shown(value)} is neither RFC 3339 with a zone (2026-11-30T12:00:00Z) "
                           "nor Unix seconds (after 1970, before 2514)")


def shown(value, limit: int = 80) -> str:
    """`value` fit to quote in an error: its repr cut to `limit`, every control character escaped."""
    text = repr(value)
    return escape(text if len(text) <= limit else text[:limit] + "…")


def escape(text: str) -> str:
    """`text` with every character that is not printable (control, bidi override) written as an escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def format_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_line(line: str) -> Sample:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageFormatError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    except (ValueError, RecursionError):  # a number of thousands of digits, nesting beyond the stack
        raise UsageFormatError("not JSON this reader accepts (a number too long, or nesting too deep)") from None
    if not isinstance(doc, dict):
        raise UsageFormatError("a line must be a JSON object")
    model = doc.get("model")
    if not isinstance(model, str) or model.count("/") != 1:
        raise UsageFormatError(f"model {shown(model)} must be namespace/name")
    values = {}
    for key, field in _NUMBERS.items():
        value = doc.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= LIMITS[key]:
            raise UsageFormatError(f"{key} must be a finite number from 0 to {_LIMIT_WORDS[LIMITS[key]]}, or "
                                   f"null, not {shown(value)}")
        values[field] = int(value) if key.endswith("Bytes") or key in ("refusals", "ooms") else float(value)
    unknown = sorted(set(doc) - set(_NUMBERS) - {"time", "model"})
    if unknown:
        raise UsageFormatError(f"unknown fields {', '.join(escape(k)[:40] for k in unknown[:5])}; the format is documented in "
                               "docs/guide.md (Right-sizing)")
    return Sample(time=parse_time(doc.get("time")), model=model, **values)


def read_samples(lines: Iterable[str | bytes | None], origin: str = "usage") -> list[Sample]:
    """Every sample, sorted by time (stable); raises UsageFormatError naming the first bad line. A line may be
    text or the bytes read (decoded here); None stands for a line longer than MAX_LINE_BYTES."""
    samples = []
    for number, line in enumerate(lines, 1):
        try:
            text = _text(line)
            if text.strip():
                samples.append(parse_line(text))
        except UsageFormatError as exc:
            raise UsageFormatError(f"{escape(origin)}:{number}: {exc}") from None
    return sorted(samples, key=lambda s: s.time)


def _text(line: str | bytes | None) -> str:
    if line is None or len(line) > MAX_LINE_BYTES:
        raise UsageFormatError(f"longer than {MAX_LINE_BYTES} bytes: a sample is one JSON object on one line")
    if isinstance(line, str):
        return line
    try:
        return decode_utf8(line)
    except NotUtf8 as exc:
        raise UsageFormatError(f"{exc.in_line}; save the file as UTF-8") from None


def lines_of(handle: BinaryIO) -> Iterator[bytes | None]:
    """The lines of a binary file, each at most MAX_LINE_BYTES (a longer one is None, and read past)."""
    while True:
        line = handle.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) <= MAX_LINE_BYTES:
            yield line
            continue
        while line and not line.endswith(b"\n"):  # the rest of the long line
            line = handle.readline(MAX_LINE_BYTES)
        yield None


def read_usage_file(path: Path | str) -> list[Sample]:
    """The samples of a usage file ('-': standard input), read as bytes; UsageFormatError names the bad line,
    OSError when the file cannot be read."""
    if str(path) == "-":
        return read_samples(lines_of(sys.stdin.buffer), "<stdin>")
    with open(path, "rb") as handle:
        return read_samples(lines_of(handle), str(path))


def dump_sample(sample: Sample) -> str:
    doc = {"time": format_time(sample.time), "model": sample.model}
    for key, field in _NUMBERS.items():
        value = getattr(sample, field)
        if value is not None:
            doc[key] = value
    return json.dumps(doc, separators=(",", ":"))


def by_model(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.model, []).append(s)
    return out


def dump_lines(samples: Iterable[Sample]) -> Iterator[str]:
    for s in samples:
        yield dump_sample(s) + "\n"

