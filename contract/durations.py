"""Durations: the one syntax of every duration the project reads, on every command's flags and in specs.

A number (up to 9 digits, an optional decimal part) followed by a unit: `ms`, `s`, `m`, `h` or
`d` (`500ms`, `30s`, `1.5h`, `2d`); a bare number is seconds. `spec.rightsizing` durations are
the whole-number subset the ElasticModel schema admits (`90s`, `5m`, `6h`, `1d`). Called by the
command lines (`duration_flag`: reconcile's --interval and --rightsize-*, rightsize's --window
and --step, usage export's --since and --step) and by controller.policy.
"""
from __future__ import annotations

import argparse
import re

_DURATION = re.compile(r"^([0-9]{1,9}(?:\.[0-9]{1,6})?)(ms|s|m|h|d)?$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
EXAMPLES = "500ms, 30s, 5m, 1.5h or 2d"


def parse_duration(text: str) -> float:
    """Seconds in `text`; ValueError (saying the syntax) when it is not a duration."""
    match = _DURATION.match(str(text).strip())
    if not match:
        raise ValueError(f"{str(text)[:40]!r} is not a duration; write a number with ms, s, m, h or d, e.g. "
                         f"{EXAMPLES}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def duration_flag(text: str) -> float:
    """An argparse type: a duration above zero, in seconds."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration above zero; write e.g. {EXAMPLES}")
    return seconds
