"""Typed results of `bertserve.client.Client`: plain dataclasses built from the gRPC replies, with numpy
arrays for vectors and attention maps. Field names follow bertserve/v1/inference.proto, so the protocol's
comments describe them; `to_dict()` gives JSON-ready data with every field (zero values included)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


class _Result:
    def to_dict(self) -> dict:
        """Every field, nested dataclasses as dicts and arrays as lists (for JSON)."""
        return _plain(self)


def _from_message(cls, message, **converted):
    """`cls` from the same-named fields of a protobuf message; `converted` gives the non-plain ones."""
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in converted:
            values[field.name] = converted[field.name]
            continue
        value = getattr(message, field.name)
        if hasattr(value, "items"):  # a protobuf map
            value = dict(value)
        elif not isinstance(value, str | bytes | int | float | bool):  # a repeated scalar field
            value = list(value)
        values[field.name] = value
    return cls(**values)


@dataclass(frozen=True)
class Metadata(_Result):
    """What answered the call and what it cost: see ResponseMetadata in the protocol."""

    model: str
    model_version: int
    total_tokens: int
    input_tokens: list[int]
    truncated: list[bool]
    queue_time_ms: float
    inference_time_ms: float
    tokenize_time_ms: float
    batches: int

    @classmethod
    def from_proto(cls, message) -> Metadata:
        return _from_message(cls, message)


@dataclass(frozen=True)
class SparseEmbedding(_Result):
    indices: np.ndarray  # uint32 vocabulary ids, ascending
    values: np.ndarray  # float32 weights, one per id

    def weights(self) -> dict[int, float]:
        """{token id: weight}."""
        return dict(zip(self.indices.tolist(), self.values.tolist(), strict=True))


@dataclass(frozen=True)
class Embeddings(_Result):
    vectors: np.ndarray | None  # float32 [inputs, dimension], in input order; None: "float" not asked
    model: str
    dimension: int
    metadata: Metadata
    # the vectors in the other encodings asked for: "float16" float16 [inputs, dimension], "int8" int8 and
    # "uint8" uint8 [inputs, dimension], "binary" int8 and "ubinary" uint8 [inputs, ceil(dimension / 8)]
    encodings: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    tokens: list[np.ndarray] | None = None  # per input float32 [tokens, hidden], when asked
    sparse: list[SparseEmbedding] | None = None  # per input, when asked
    chunks: list[int] | None = None  # per input, the windows pooled (chunked calls)


@dataclass(frozen=True)
class MaskCandidate(_Result):
    token: str
    token_id: int
    score: float
    sequence: str


@dataclass(frozen=True)
class MaskPrediction(_Result):
    position: int  # index of the mask among the input's tokens
    candidates: list[MaskCandidate]  # best first


@dataclass(frozen=True)
class FillMaskResult(_Result):
    masks: list[MaskPrediction]  # in the order the masks appear in the input


@dataclass(frozen=True)
class FilledMasks(_Result):
    results: list[FillMaskResult]  # one per input, in order
    model: str
    metadata: Metadata


@dataclass(frozen=True)
class LabelScore(_Result):
    label: str
    index: int
    score: float


@dataclass(frozen=True)
class Classification(_Result):
    labels: list[LabelScore]  # best first


@dataclass(frozen=True)
class Classifications(_Result):
    results: list[Classification]  # one per input, in order
    model: str
    metadata: Metadata


@dataclass(frozen=True)
class RankedDocument(_Result):
    index: int  # the document's position in the request
    score: float  # relevance; higher is better
    document: str  # its text when return_documents was asked for, else ""
    truncated: bool  # the pair (or, by cosine, a text) was cut to max_length


@dataclass(frozen=True)
class Reranking(_Result):
    results: list[RankedDocument]  # best first, the top_n
    method: str  # "cross_encoder" | "cosine" | "cross_encoder+cosine"
    model: str
    metadata: Metadata  # per document, in request order


@dataclass(frozen=True)
class PairScore(_Result):
    score: float
    truncated: bool


@dataclass(frozen=True)
class PairScores(_Result):
    results: list[PairScore]  # one per pair, in order
    method: str  # "cross_encoder" | "cosine" | "cross_encoder+cosine"
    model: str
    metadata: Metadata

    @property
    def scores(self) -> np.ndarray:
        """The scores as float32 [pairs]."""
        return np.array([r.score for r in self.results], dtype=np.float32)


@dataclass(frozen=True)
class Token(_Result):
    text: str
    id: int
    start: int  # character offsets into the input, end exclusive (0, 0 for special tokens)
    end: int
    special: bool


@dataclass(frozen=True)
class TokenizedInput(_Result):
    tokens: list[Token]


@dataclass(frozen=True)
class Tokenization(_Result):
    results: list[TokenizedInput]  # one per input, in order
    model: str
    metadata: Metadata


@dataclass(frozen=True)
class AttentionMap(_Result):
    layer: int
    head: int
    probabilities: np.ndarray  # float32 [sequence_length, sequence_length]; row = query token, sums to 1


@dataclass(frozen=True)
class AttentionMaps(_Result):
    tokens: list[Token]  # the rows and columns of every map
    sequence_length: int
    num_layers: int
    num_heads: int
    maps: list[AttentionMap]  # per requested layer (request order), per requested head
    model: str
    metadata: Metadata

    def matrix(self, layer: int, head: int) -> np.ndarray:
        """The map of one layer and head: [sequence_length, sequence_length]."""
        for item in self.maps:
            if (item.layer, item.head) == (layer, head):
                return item.probabilities
        raise KeyError(f"the response holds no map for layer {layer} head {head}")


@dataclass(frozen=True)
class ModelInfo(_Result):
    name: str
    version: int
    tasks: list[str]
    default_for: list[str]
    dimension: int
    max_length: int
    vocab_size: int
    num_layers: int
    precision: str
    provider: str
    pooling: str
    normalize_default: bool
    mask_token: str
    labels: list[str]
    problem_type: str
    encoder: str
    pairs: bool  # a classifier trained on sentence pairs
    cross_encoder: bool  # one score per pair: answers Rerank and Score
    dimensions: list[int]  # Matryoshka dimensions a vector may be cut to (besides `dimension`)
    prompts: dict[str, str]  # name -> text prepended to an input
    default_prompt_name: str  # the prompt a call naming none gets ("": none)
    encodings: list[str]  # the dense encodings offered
    sparse: bool  # answers sparse (SPLADE) embeddings
    cosine_of: str  # a cross-encoder whose scores add this embedding model's cosine ("": none)


@dataclass(frozen=True)
class Limits(_Result):
    max_inputs_per_request: int
    max_input_chars: int
    max_message_bytes: int
    max_batch_size: int
    max_batch_tokens: int
    max_queue_inputs: int
    max_queue_delay_ms: float
    max_masks_per_input: int
    max_padding_ratio: float
    max_queue_attention: int


@dataclass(frozen=True)
class ServerInfo(_Result):
    server_version: str
    models: list[ModelInfo]
    limits: Limits
    versions: dict[str, str]


# --- from the gRPC replies ---------------------------------------------------------------------------


# the bytes fields of Embedding: each encoding's element type
ENCODING_DTYPES = {"float16": "<f2", "int8": "i1", "uint8": "u1", "binary": "i1", "ubinary": "u1"}


def embeddings(
    reply,
    *,
    floats: bool = True,
    encodings: tuple[str, ...] = (),
    tokens: bool = False,
    sparse: bool = False,
    chunked: bool = False,
) -> Embeddings:
    """The reply of a call that asked for `floats` (the "float" encoding of the dense vector), the other
    `encodings`, `tokens`, `sparse` and chunking."""
    rows = reply.embeddings
    vectors = None
    if floats:
        vectors = np.zeros((len(rows), reply.dimension), dtype=np.float32)
        for row, embedding in enumerate(rows):
            vectors[row] = embedding.values
    encoded = {
        name: _stacked(
            [np.frombuffer(getattr(e, name), ENCODING_DTYPES[name]) for e in rows], ENCODING_DTYPES[name]
        )
        for name in encodings
        if name in ENCODING_DTYPES
    }
    return Embeddings(
        vectors,
        reply.metadata.model,
        reply.dimension,
        Metadata.from_proto(reply.metadata),
        encodings=encoded,
        tokens=[_token_matrix(e.tokens) for e in rows] if tokens else None,
        sparse=[
            SparseEmbedding(np.array(e.sparse.indices, np.uint32), np.array(e.sparse.values, np.float32))
            for e in rows
        ]
        if sparse
        else None,
        chunks=[e.chunks for e in rows] if chunked else None,
    )


def _stacked(rows: list[np.ndarray], dtype: str) -> np.ndarray:
    if not rows:
        return np.zeros((0, 0), dtype)
    return np.stack(rows).astype(np.dtype(dtype).newbyteorder("="), copy=False)


def _token_matrix(message) -> np.ndarray:
    values = np.array(message.values, dtype=np.float32)
    return values.reshape(message.count, -1) if message.count else values.reshape(0, 0)


def filled_masks(reply) -> FilledMasks:
    results = [
        FillMaskResult(
            [
                MaskPrediction(mask.position, [_from_message(MaskCandidate, c) for c in mask.candidates])
                for mask in result.masks
            ]
        )
        for result in reply.results
    ]
    return FilledMasks(results, reply.metadata.model, Metadata.from_proto(reply.metadata))


def classifications(reply) -> Classifications:
    results = [Classification([_from_message(LabelScore, s) for s in r.labels]) for r in reply.results]
    return Classifications(results, reply.metadata.model, Metadata.from_proto(reply.metadata))


def reranking(reply) -> Reranking:
    results = [_from_message(RankedDocument, r) for r in reply.results]
    return Reranking(results, reply.method, reply.metadata.model, Metadata.from_proto(reply.metadata))


def pair_scores(reply) -> PairScores:
    results = [_from_message(PairScore, r) for r in reply.results]
    return PairScores(results, reply.method, reply.metadata.model, Metadata.from_proto(reply.metadata))


def tokenization(reply) -> Tokenization:
    results = [TokenizedInput([_from_message(Token, t) for t in r.tokens]) for r in reply.results]
    return Tokenization(results, reply.metadata.model, Metadata.from_proto(reply.metadata))


def attention_maps(reply) -> AttentionMaps:
    n = reply.sequence_length
    maps = [
        AttentionMap(m.layer, m.head, np.asarray(m.probabilities, dtype=np.float32).reshape(n, n))
        for m in reply.maps
    ]
    return _from_message(
        AttentionMaps,
        reply,
        tokens=[_from_message(Token, t) for t in reply.tokens],
        maps=maps,
        model=reply.metadata.model,
        metadata=Metadata.from_proto(reply.metadata),
    )


def server_info(reply) -> ServerInfo:
    return _from_message(
        ServerInfo,
        reply,
        models=[_from_message(ModelInfo, m) for m in reply.models],
        limits=_from_message(Limits, reply.limits),
    )
