"""Replayed usage files are untrusted: every bad line is an error naming its line, and no control character
(terminal escapes, bidi overrides, NUL) is ever echoed raw."""
from __future__ import annotations

import pytest

from controller.rightsizing.usage import UsageFormatError, read_samples

GOOD = '{"time":1,"model":"llm/chat","deviceBytes":5}'
BAD_LINES = [  # (id, line)
    ("escape-in-model", '{"time":1,"model":"llm/\\u001b[2Jchat\\u0007x","deviceBytes":5,"extra":1}'),
    ("escape-in-unknown-key", '{"time":1,"model":"llm/chat","\\u001b]0;owned\\u0007":1}'),
    ("bidi-in-value", '{"time":1,"model":"llm/chat","deviceBytes":"\\u202e5"}'),
    ("nul-in-time", '{"time":"\\u0000","model":"llm/chat"}'),
    ("negative", '{"time":1,"model":"llm/chat","deviceBytes":-1}'),
    ("nan", '{"time":1,"model":"llm/chat","deviceBytes":NaN}'),
    ("infinity", '{"time":1,"model":"llm/chat","ttftSeconds":Infinity}'),
    ("absurd-bytes", '{"time":1,"model":"llm/chat","deviceBytes":1e300}'),
    ("beyond-int64", '{"time":1,"model":"llm/chat","deviceBytes":' + str(2 ** 70) + '}'),
    ("thousands-of-digits", '{"time":1,"model":"llm/chat","deviceBytes":' + "9" * 5000 + '}'),
    ("deep-nesting", "[" * 100_000 + "]" * 100_000),
    ("time-beyond-any-clock", '{"time":1e300,"model":"llm/chat","deviceBytes":5}'),
    ("time-before-1970", '{"time":-5,"model":"llm/chat","deviceBytes":5}'),
    ("a-day-of-latency", '{"time":1,"model":"llm/chat","deviceBytes":5,"tpotSeconds":90000}'),
    ("not-an-object", "[1,2]"),
    ("garbage-bytes-decoded", "\x1b[31m\x00\x7f"),
]


@pytest.mark.parametrize("case,line", BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_a_bad_line_names_its_line_and_echoes_no_control_character(case, line):
    with pytest.raises(UsageFormatError) as caught:
        read_samples([GOOD, "", line, GOOD], "usage\x1b[2J.jsonl")
    message = str(caught.value)
    assert message.startswith("usage\\x1b[2J.jsonl:3: ")
    assert all(c.isprintable() for c in message), message
    assert len(message) < 400
