"""The lines of `bertserve embed-file`'s INPUT: what each line is, and whether it can be embedded.

A line ends at `\\n` only, and the `\\r` of a `\\r\\n` is dropped with it; a `\\r` anywhere else is part of
the text, so line N of INPUT is always row N - 1 of the output (a lone `\\r` does not start a line as
Python's universal newlines would). Lines are read as bytes and decoded as UTF-8 one by one, so a line
that is not UTF-8 is one bad line, named by its number. A bad line (not UTF-8; with --field not a JSON
object with that string field; empty or whitespace-only; longer than the server's max_input_chars
without --truncate) carries its `problem` instead of a text; the command fails or skips it
(--on-bad-line). With --truncate, a text over max_input_chars is cut to it here, as the server refuses it.

Memory per line is bounded: at most `line_bytes_limit` bytes of a line are held, the rest is read past.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

READ_PAST_BYTES = 1 << 20  # chunk read and dropped past a line's limit
UTF8_MAX_BYTES = 4  # most bytes of one character in UTF-8
JSON_MAX_BYTES_PER_CHAR = 12  # a character outside the BMP written as two \uXXXX escapes
JSON_OTHER_FIELDS_BYTES = 1 << 20  # room in a JSON Lines record for fields other than --field


@dataclass(frozen=True)
class Line:
    number: int  # from 1
    digest: bytes  # SHA-256 of the line's bytes as read (resuming checks the lines done by these)
    text: str | None  # what to embed; None for a bad line
    problem: str | None = None  # why the line cannot be embedded


def line_bytes_limit(max_chars: int, field: str | None) -> int:
    """Bytes of a line that can hold a text of max_chars characters (with its line end)."""
    if field is None:
        return UTF8_MAX_BYTES * max_chars + len(b"\r\n") + 1
    return JSON_MAX_BYTES_PER_CHAR * max_chars + JSON_OTHER_FIELDS_BYTES


def count_lines(path: Path) -> int:
    lines, last = 0, b"\n"
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def _read_line(source: BinaryIO, limit: int) -> tuple[bytes, bool, bytes] | None:
    """(the line's first bytes, without its line end; whether it went past `limit`; its digest)."""
    head = source.readline(limit)
    if not head:
        return None
    digest = hashlib.sha256(head)
    chunk, overflow = head, False
    while not chunk.endswith(b"\n"):
        chunk = source.readline(READ_PAST_BYTES)
        if not chunk:
            break
        overflow = True
        digest.update(chunk)
    if not overflow:
        head = head.removesuffix(b"\n").removesuffix(b"\r")
    return head, overflow, digest.digest()


def _decode(data: bytes, cut: bool) -> str:
    """UTF-8 text of `data`; `cut`: data stops at an arbitrary byte, so an incomplete last character is
    dropped rather than refused."""
    if not cut:
        return data.decode("utf-8")
    return codecs.getincrementaldecoder("utf-8")().decode(data, final=False)


def _not_utf8(exc: UnicodeDecodeError) -> str:
    return f"not UTF-8 (byte 0x{exc.object[exc.start]:02x} at byte {exc.start} of the line)"


def _text_of(head: bytes, overflow: bool, field: str | None, limit: int) -> str:
    """The text of a line, or ValueError with the reason it has none."""
    if field is None:
        try:
            return _decode(head, cut=overflow)
        except UnicodeDecodeError as exc:
            raise ValueError(_not_utf8(exc)) from None
    if overflow:
        raise ValueError(f"a JSON Lines record over {limit} bytes, more than any text the server takes")
    try:
        record = json.loads(head.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(_not_utf8(exc)) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    text = record.get(field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise ValueError(f"no string field {field!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a \ud800 escape: no Unicode text, gRPC could not send it
        raise ValueError(f"field {field!r}: a lone surrogate at character {exc.start}") from None
    return text


def read_lines(source: BinaryIO, *, field: str | None, max_chars: int, truncate: bool) -> Iterator[Line]:
    """Every line of `source`, numbered, each with its text or its problem."""
    limit = line_bytes_limit(max_chars, field)
    number = 0
    while (read := _read_line(source, limit)) is not None:
        number += 1
        head, overflow, digest = read
        try:
            text = _text_of(head, overflow, field, limit)
        except ValueError as exc:
            yield Line(number, digest, None, str(exc))
            continue
        if len(text) > max_chars:
            if not truncate:
                problem = f"{len(text)}{'+' if overflow else ''} characters is more than the server's max_input_chars {max_chars} (--truncate cuts it)"  # fmt: skip
                yield Line(number, digest, None, problem)
                continue
            text = text[:max_chars]
        if not text.strip():
            yield Line(number, digest, None, "empty or whitespace-only text")
            continue
        yield Line(number, digest, text)
