"""JSON request bodies -> Python values, with the limits checked before the work.

- Counts first: a body is refused, before it is parsed, when it holds more JSON strings or values than a
  request of `max_inputs_per_request` inputs can. They are counted on the raw bytes with a few C-speed
  scans, exact for valid JSON: Python's JSON parser holds the GIL for its whole run, so a worker thread
  alone would not keep the event loop free while it builds millions of tiny values.
- Off the loop: bodies above `OFF_LOOP_BYTES` are parsed (and checked) on the CPU pool, and so are
  replies estimated above it built (`off_loop_above`).
- Refused with 400: invalid UTF-8, NaN and Infinity literals, numbers beyond the float range (1e999),
  lone surrogates (a "\\ud800" escape is not Unicode text; named by the field that holds it), arrays and
  objects nested more than `MAX_JSON_DEPTH` deep (counted on the bytes before parsing: what reads the
  values later, error messages included, never meets a depth a client chose).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from bertserve.service.errors import InvalidInput, quote
from bertserve.service.http.status import HttpError

if TYPE_CHECKING:
    from bertserve.service.http.app import HttpFront

T = TypeVar("T")

OFF_LOOP_BYTES = 64 * 1024  # bodies larger than this are decoded on the CPU pool
JSON_FLOAT_BYTES = 20  # a float in a reply's JSON, about: to estimate a reply's size
# JSON strings (or values) a request holds besides its inputs: field names, parameters, outputs.
STRUCTURE_ALLOWANCE = 1024
MAX_JSON_DEPTH = 32  # arrays and objects inside each other; a request of any route needs at most five
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # an opening one +1, a closing one -1 (int8)
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[{]}"))
SURROGATE = re.compile("[\ud800-\udfff]")


def check_counts(
    data: bytes, max_inputs: int, what: str = "body", texts_per_input: int = 1, values_per_input: int = 0
) -> None:
    """Refuses a body with more JSON strings, or values, than a request of `max_inputs` inputs holds, or with
    arrays and objects nested more than MAX_JSON_DEPTH deep;
    `texts_per_input` 2: each input is a pair of texts (or a document object's key and text);
    `values_per_input`: JSON values an input may hold (an array of token ids: the model's max_length)."""
    strings_limit = texts_per_input * max_inputs + STRUCTURE_ALLOWANCE
    values_limit = max(2 * texts_per_input, values_per_input) * max_inputs + STRUCTURE_ALLOWANCE
    inputs = "inputs" if texts_per_input == 1 else "inputs (pairs)"
    text = data
    if b"\\" in text:  # escapes occur only inside strings: drop escaped backslashes, then escaped quotes
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    strings = text.count(b'"') // 2
    if strings > strings_limit:
        raise InvalidInput(
            f"{what}: {strings} JSON strings is more than a request of max_inputs_per_request {max_inputs} "
            f"{inputs} holds (at most {strings_limit}); send at most {max_inputs} inputs in one request"
        )
    opened = text.count(b"[") + text.count(b"{")
    if text.count(b",") + opened <= values_limit and opened <= MAX_JSON_DEPTH:
        return
    outside = b"".join(text.split(b'"')[::2])  # the body without its strings: at most strings_limit parts
    values = outside.count(b",") + outside.count(b"[") + outside.count(b"{")
    if values > values_limit:
        raise InvalidInput(
            f"{what}: {values} JSON values is more than a request of max_inputs_per_request {max_inputs} "
            f"{inputs} holds (at most {values_limit}); send at most {max_inputs} inputs in one request"
        )
    if opened > MAX_JSON_DEPTH:
        marks = np.frombuffer(outside.translate(_BRACKETS, _NOT_BRACKETS), np.int8)
        depth = int(np.cumsum(marks, dtype=np.int64).max(initial=0))
        if depth > MAX_JSON_DEPTH:
            raise InvalidInput(
                f"{what}: JSON arrays and objects nested {depth} deep, more than {MAX_JSON_DEPTH}"
            )


def _constant(name: str) -> float:
    raise HttpError(400, f"body: {name} is not a JSON number; send finite numbers")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise HttpError(400, f"body: the number {quote(text, 32)} is beyond the range of a 64-bit float")
    return value


def _field(path: str, key: str) -> str:
    if key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{quote(key)}]"


def check_surrogates(value: object, what: str = "body") -> None:
    """Refuses the first string (or field name), in document order, that holds a lone surrogate."""
    stack: list[tuple[object, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if found := SURROGATE.search(item):
                raise InvalidInput(
                    f"{path or what}: lone surrogate U+{ord(found.group()):04X} at character {found.start()}; "
                    "send Unicode text (a character above U+FFFF as a surrogate pair)"
                )
        elif isinstance(item, list):
            stack.extend((item[i], f"{path or what}[{i}]") for i in range(len(item) - 1, -1, -1))
        elif isinstance(item, dict):
            entries = list(item.items())
            for key, _ in entries:
                if SURROGATE.search(key):
                    raise InvalidInput(f"{path or what}: a field name holds a lone surrogate ({quote(key)})")
            stack.extend((v, _field(path, k)) for k, v in reversed(entries))


def parse_json(
    data: bytes, max_inputs: int, what: str = "body", texts_per_input: int = 1, values_per_input: int = 0
) -> object:
    """The JSON value of `data` (blocking: a large body goes through `off_loop_above`)."""
    check_counts(data, max_inputs, what, texts_per_input, values_per_input)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise HttpError(400, f"{what}: not valid UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float)
    except RecursionError:
        raise HttpError(400, f"{what}: JSON nested too deeply") from None
    except ValueError as exc:
        raise HttpError(400, f"{what}: not valid JSON ({exc})") from None
    if SURROGATE_ESCAPE.search(data):
        check_surrogates(value, what)
    return value


async def off_loop_above(front: HttpFront, size: int, work: Callable[..., T], *args) -> T:
    """`work(*args)` on the event loop when it handles `size` bytes, up to OFF_LOOP_BYTES, else on the CPU
    pool: a large body is decoded, and a large reply built, without holding the loop."""
    if size <= OFF_LOOP_BYTES:
        return work(*args)
    return await front.core.off_loop(work, *args)
