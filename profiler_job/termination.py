"""The one line a failed Job leaves in its termination message, with credentials removed.

Owns redaction of Hugging Face tokens and writing the line to the termination-log
file (Kubernetes shows it in the Pod's `state.terminated.message`, at most 4096
bytes). Called by profiler_job.cli on every failure; the progress log uses
`redact` too.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
MAX_MESSAGE_BYTES = 4096  # Kubernetes truncates a termination message beyond this
TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "HF_HUB_TOKEN")
_TOKEN_PATTERN = re.compile(r"\bhf_[A-Za-z0-9]{8,}\b")
REDACTED = "[REDACTED]"


def redact(text: str, environ: dict[str, str] | None = None) -> str:
    """`text` without the values of the Hugging Face token variables or anything shaped like a token."""
    env = os.environ if environ is None else environ
    for var in TOKEN_ENV_VARS:
        secret = env.get(var, "")
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return _TOKEN_PATTERN.sub(REDACTED, text)


def one_line(text: str) -> str:
    """Whitespace (newlines included) collapsed, redacted, cut to the termination-message limit."""
    line = " ".join(redact(text).split())
    encoded = line.encode()
    if len(encoded) <= MAX_MESSAGE_BYTES:
        return line
    return encoded[: MAX_MESSAGE_BYTES - 3].decode(errors="ignore") + "..."


def write_termination_line(path: str | Path, text: str) -> str:
    """Write `text` as one line to `path` (best effort: a missing directory outside a Pod is not an error)."""
    line = one_line(text)
    try:
        Path(path).write_text(line + "\n")
    except OSError:
        pass
    return line
