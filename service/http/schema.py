"""JSON request bodies -> typed values. A wrong body is refused with a message naming the field: the HTTP
layer's own errors (content type, not JSON) as `HttpError`, field errors as `InvalidInput` (400). Parsing
and its limits: `json_body.py`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from bertserve.service.errors import InvalidInput, quote
from bertserve.service.http.json_body import off_loop_above, parse_json
from bertserve.service.http.status import HttpError
from bertserve.service.http.transport import Request

if TYPE_CHECKING:
    from bertserve.service.http.app import HttpFront

JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def kind_of(value: object) -> str:
    if isinstance(value, bool | str | dict | list) or value is None:
        return JSON_TYPES[type(value)]
    return "a number"


def check_content_type(request: Request, allowed: Iterable[str] = ("application/json",)) -> None:
    """A missing Content-Type is taken as JSON; another media type is 415."""
    given = request.headers.get("content-type")
    if given is None:
        return
    media = given.split(";", 1)[0].strip().lower()
    if media not in allowed:
        raise HttpError(415, f"content-type: {given[:64]!r} is not supported; send {' or '.join(allowed)}")
    if request.headers.get("content-encoding", "identity").lower() != "identity":
        raise HttpError(415, "content-encoding: compressed request bodies are not supported")


async def json_object(
    front: HttpFront, request: Request, texts_per_input: int = 1, values_per_input: int = 0
) -> dict:
    """The request body as a JSON object (a large body is parsed off the event loop); `texts_per_input`:
    2 for routes whose inputs are pairs of texts; `values_per_input`: for routes that take token ids (see
    `check_counts`)."""
    check_content_type(request)
    if not request.body:
        raise HttpError(400, "body: empty; send a JSON object")
    limit = front.settings.max_inputs_per_request
    value = await off_loop_above(
        front, len(request.body), parse_json, request.body, limit, "body", texts_per_input, values_per_input
    )
    if not isinstance(value, dict):
        raise HttpError(400, f"body: must be a JSON object (got {kind_of(value)})")
    return value


class Fields:
    """Typed access to a JSON object's fields; unknown fields are refused (a typo is not ignored).
    JSON null counts as absent."""

    def __init__(self, body: dict, allowed: Iterable[str], prefix: str = ""):
        self.body, self.prefix = body, prefix
        allowed = tuple(allowed)
        for name in body:
            if name not in allowed:
                raise InvalidInput(f"{prefix}{str(name)[:64]}: unknown field (fields: {', '.join(allowed)})")

    def _get(self, name: str, kinds: tuple[type, ...], kind: str, default: object) -> object:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise InvalidInput(f"{self.prefix}{name}: must be {kind} (got {kind_of(value)})")
        return value

    def string(self, name: str, default: str = "") -> str:
        return self._get(name, (str,), "a string", default)

    def boolean(self, name: str, default: bool | None = False) -> bool | None:
        return self._get(name, (bool,), "true or false", default)

    def integer(self, name: str, default: int | None = None) -> int | None:
        value = self._get(name, (int, float), "an integer", default)
        if isinstance(value, float):
            if not value.is_integer():
                raise InvalidInput(f"{self.prefix}{name}: must be an integer (got {value})")
            value = int(value)
        if value is not None and not -(1 << 63) <= value < 1 << 63:
            raise InvalidInput(f"{self.prefix}{name}: must be a 64-bit integer (got {quote(value, 32)})")
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.string(name, default)
        if value not in choices:
            raise InvalidInput(
                f"{self.prefix}{name}: must be one of {', '.join(choices)} (got {value[:64]!r})"
            )
        return value

    def strings(self, name: str, required: bool = True) -> list[str]:
        value = self._get(name, (list,), "an array of strings", None)
        if value is None:
            if required:
                raise InvalidInput(f"{self.prefix}{name}: required (an array of strings)")
            return []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise InvalidInput(f"{self.prefix}{name}[{i}]: must be a string (got {kind_of(item)})")
        return value

    def integers(self, name: str, max_items: int) -> list[int]:
        value = self._get(name, (list,), "an array of integers", [])
        if len(value) > max_items:
            raise InvalidInput(
                f"{self.prefix}{name}: {len(value)} items is more than the {max_items} there are"
            )
        for i, item in enumerate(value):
            if not isinstance(item, int) or isinstance(item, bool) or item < 0:
                raise InvalidInput(
                    f"{self.prefix}{name}[{i}]: must be an integer >= 0 (got {quote(item, 32)})"
                )
        return value

    def required_string(self, name: str) -> str:
        value = self.string(name, None)
        if value is None:
            raise InvalidInput(f"{self.prefix}{name}: required (a string)")
        return value
