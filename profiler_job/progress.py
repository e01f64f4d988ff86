"""Progress by stage: a progress bar on a terminal, one JSON log line per stage otherwise.

Owns the stage list (load, weights, kv, prefill, decode, bandwidth, publish) and
the log-line shape: {"time", "level", "stage", "event", "elapsedMs", ...details}.
Called by profiler_job.run around each stage (and `note` for the download's
byte progress within the load stage) and by profiler_job.cli for the failure
line. Messages pass through termination.redact.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, TextIO

from profiler_job.termination import redact

STAGES = ("load", "weights", "kv", "prefill", "decode", "bandwidth", "publish")


class Progress:
    def __init__(self, stream: TextIO, *, tty: bool):
        self._stream = stream
        self._current: str | None = None
        self._bar = None
        if tty:
            from tqdm import tqdm
            self._bar = tqdm(total=len(STAGES), file=stream, unit="stage", leave=True)

    @contextmanager
    def stage(self, name: str) -> Iterator[dict[str, Any]]:
        """Run one stage; the caller may put numbers into the yielded dict to be logged with it."""
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}; stages are {STAGES}")
        self._current = name
        if self._bar is not None:
            self._bar.set_description(name)
        details: dict[str, Any] = {}
        start = time.monotonic()
        yield details
        elapsed_ms = round((time.monotonic() - start) * 1000.0, 1)
        if self._bar is not None:
            self._bar.set_postfix_str(f"{name} {elapsed_ms:.0f} ms")
            self._bar.update(1)
        else:
            self._log("info", stage=name, event="done", elapsedMs=elapsed_ms, **details)

    def note(self, message: str) -> None:
        """A line within the current stage (the download's byte progress): above the bar on a terminal, else one
        JSON line with event "progress"."""
        if self._bar is not None:
            self._bar.write(redact(message), file=self._stream)
        else:
            self._log("info", stage=self._current, event="progress", message=message)

    def failed(self, reason: str, line: str) -> None:
        if self._bar is not None:
            self._bar.close()
            self._stream.write(redact(line) + "\n")
        else:
            self._log("error", stage=self._current, event="failed", reason=reason, message=line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def _log(self, level: str, **fields: Any) -> None:
        record = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "level": level, **fields}
        self._stream.write(redact(json.dumps(record)) + "\n")
        self._stream.flush()
