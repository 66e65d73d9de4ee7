"""bertserve.v1 EmbedRequest / EmbedStreamRequest options -> the core's embed arguments, and the core's
option errors named as this protocol's fields (`options.dimensions`, not `dimensions`).

The core (service/core/core.py `embed`) checks every option against the model; this only maps fields:
`options.dense` means "also the pooled vector" beside `tokens` or `sparse` (without them the pooled
vector is the answer), empty `encodings` means "float", an unset `chunking` means none.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bertserve.service.core.results import EmbedResult
from bertserve.service.core.task_calls import Chunking, EmbedCall
from bertserve.service.errors import InvalidInput
from bertserve.v1 import inference_pb2 as pb

DEFAULT_ENCODINGS = ("float",)
# the core names an option by its EmbedOptions field; longer names first so "sparse" does not take
# "sparse_threshold"
OPTION_FIELDS = sorted((f.name for f in pb.EmbedOptions.DESCRIPTOR.fields), key=len, reverse=True)
_OPTION_PREFIX = re.compile(rf"({'|'.join(OPTION_FIELDS)})(?![\w])")


@dataclass(frozen=True)
class EmbedArguments:
    """What one Embed (or EmbedStream request) asks of `core.embed`."""

    texts: Sequence[str]
    call: EmbedCall
    prompt_name: str | None
    truncation_direction: str
    token_ids: Sequence[Sequence[int]] | None
    chunking: Chunking | None

    @property
    def inputs(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else len(self.texts)

    @property
    def floats(self) -> bool:
        """The answer carries `values` (float32): the pooled vector was asked for, "float" among its encodings."""
        return self.call.dense and "float" in self.call.encodings

    def keywords(self) -> dict:
        """`core.embed`'s keyword arguments beside model, texts, truncate and deadline."""
        return {
            "call": self.call,
            "prompt_name": self.prompt_name,
            "truncation_direction": self.truncation_direction,
            "token_ids": self.token_ids,
            "chunking": self.chunking,
        }


def embed_arguments(request: pb.EmbedRequest | pb.EmbedStreamRequest) -> EmbedArguments:
    """The request's fields as the core takes them. The token ids are handed over as the request's
    repeated fields (no copy on the event loop); the core checks their count and values."""
    options = request.options
    normalize = request.normalize if request.HasField("normalize") else None
    dense = options.dense or not (options.tokens or options.sparse)
    if options.HasField("dimensions") and options.dimensions == 0:
        raise InvalidInput("options.dimensions: 0 is not a dimension; leave it unset for the model's own")
    call = EmbedCall(
        normalize=normalize,
        dimensions=options.dimensions if options.HasField("dimensions") else None,
        dense=dense,
        tokens=options.tokens,
        sparse=options.sparse,
        sparse_threshold=options.sparse_threshold,
        encodings=tuple(dict.fromkeys(options.encodings)) or DEFAULT_ENCODINGS,
    )
    token_ids = None
    if request.token_ids:
        if request.inputs:
            raise InvalidInput(
                f"token_ids: give inputs or token_ids, not both ({len(request.inputs)} inputs and "
                f"{len(request.token_ids)} token id lists)"
            )
        token_ids = [entry.ids for entry in request.token_ids]
    chunking = None
    if options.HasField("chunking"):
        c = options.chunking
        chunking = Chunking(length=c.length, overlap=c.overlap, pooling=c.pooling or "mean")
    return EmbedArguments(
        texts=request.inputs,
        call=call,
        prompt_name=options.prompt_name or None,
        truncation_direction=options.truncation_direction or "right",
        token_ids=token_ids,
        chunking=chunking,
    )


def answer_bytes(result: EmbedResult) -> int:
    """The bytes of a result's arrays: about its answer's size."""
    arrays = [result.vectors, *result.encodings.values(), *(result.tokens or ())]
    size = sum(array.nbytes for array in arrays if array is not None)
    return size + sum(ids.nbytes + weights.nbytes for ids, weights in result.sparse or ())


def option_message(message: str) -> str:
    """A core message that names an option (`dimensions: ...`) named as this protocol's field."""
    return f"options.{message}" if _OPTION_PREFIX.match(message) else message


@contextlib.contextmanager
def options_named() -> Iterator[None]:
    """Within: the core's InvalidInput about an option names it `options.<field>`."""
    try:
        yield
    except InvalidInput as exc:
        message = str(exc)
        renamed = option_message(message)
        if renamed == message:
            raise
        raise InvalidInput(renamed) from None
