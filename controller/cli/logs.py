"""How the shells talk while they run: timestamped log lines (text or JSON) and progress on a terminal.

Owns the root logging setup of `gpushare` (`--log-format text|json`: every line carries an RFC 3339
UTC timestamp, level and logger; JSON is one object per line with the same fields) and `Progress`,
which shows the current phase of a long pass on one terminal line of stderr, and nothing when stderr
is not a terminal (CI logs, pods). Called by controller.cli.commands and the reconcile shells.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Utc(logging.Formatter):
    converter = time.gmtime

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        return time.strftime("%Y-%m-%dT%H:%M:%S", self.converter(record.created)) + f".{int(record.msecs):03d}Z"


class JsonFormatter(_Utc):
    def format(self, record: logging.LogRecord) -> str:
        line = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(log_format: str = "text", stream: TextIO | None = None, *, level: int = logging.INFO) -> None:
    """One stderr handler on the root logger, `level` and up, in `log_format`; replaces earlier handlers."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else _Utc(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class Progress:
    """The phase of a long pass on one stderr line, redrawn in place; silent unless stderr is a terminal."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.active = self.stream.isatty()
        self.started = time.monotonic()

    def __call__(self, phase: str) -> None:
        if self.active:
            self.stream.write(f"\r\033[K{phase} ({time.monotonic() - self.started:.1f} s)")
            self.stream.flush()

    def done(self) -> None:
        if self.active:
            self.stream.write("\r\033[K")
            self.stream.flush()
