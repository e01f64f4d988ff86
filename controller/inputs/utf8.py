"""Bytes read from outside (a file, a blob in git, a line of a usage file) as text: strict UTF-8.

Owns `decode_utf8`, which raises `NotUtf8` naming where the text breaks (line, column and the
offending byte in hex) and never echoing the bytes themselves, so a message built from it holds no
control character. Pure. Called by the repository reader (controller.inputs.repofiles), the
right-sizing records (controller.inputs.rightsizing_records) and the usage reader
(controller.rightsizing.usage).
"""
from __future__ import annotations


class NotUtf8(ValueError):
    """`data` is not UTF-8: `line` and `column` (1-based, in bytes) and `byte` where it breaks."""

    def __init__(self, line: int, column: int, byte: int):
        self.line, self.column, self.byte = line, column, byte
        super().__init__(f"not UTF-8 text: byte 0x{byte:02x} at line {line}, column {column}")

    @property
    def in_line(self) -> str:
        """The message for a text that is one line (the caller names the line)."""
        return f"not UTF-8 text: byte 0x{self.byte:02x} at column {self.column}"


def decode_utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        raise NotUtf8(data.count(b"\n", 0, exc.start) + 1, exc.start - start + 1, data[exc.start]) from None
