"""Typed core results (service/core/results.py) -> serialized bertserve.v1 responses (bytes).

The float arrays (embeddings, attention maps) are written with `service/grpc/wire.py` straight from numpy;
everything else through the generated classes. Each function is pure and may run off the event loop.
"""

from __future__ import annotations

import numpy as np

from bertserve.service.core.results import (
    AttentionResult,
    CallMeta,
    ClassifyResult,
    EmbedResult,
    FillMaskResult,
    RerankResult,
    ScoreResult,
    ServerInfo,
    TokenizeResult,
)
from bertserve.service.engine.tokenization import EncodedInput
from bertserve.service.grpc import wire
from bertserve.v1 import inference_pb2 as pb

EMBEDDINGS_FIELD = pb.EmbedResponse.DESCRIPTOR.fields_by_name["embeddings"].number
VALUES_FIELD = pb.Embedding.DESCRIPTOR.fields_by_name["values"].number
_EMBEDDING = pb.Embedding.DESCRIPTOR.fields_by_name
TOKENS_FIELD, SPARSE_FIELD = _EMBEDDING["tokens"].number, _EMBEDDING["sparse"].number
TOKEN_VALUES_FIELD = pb.TokenEmbeddings.DESCRIPTOR.fields_by_name["values"].number
SPARSE_VALUES_FIELD = pb.SparseEmbedding.DESCRIPTOR.fields_by_name["values"].number
# the dense vector's other encodings: Embedding's bytes field of that name, and the bytes' element type
# (int8 and binary as two's complement, float16 little-endian)
ENCODING_BYTES = {"float16": "<f2", "int8": "i1", "uint8": "u1", "binary": "i1", "ubinary": "u1"}
ENCODING_FIELDS = {name: _EMBEDDING[name].number for name in ENCODING_BYTES}
MAPS_FIELD = pb.AttentionResponse.DESCRIPTOR.fields_by_name["maps"].number
PROBABILITIES_FIELD = pb.AttentionMap.DESCRIPTOR.fields_by_name["probabilities"].number


def metadata(meta: CallMeta) -> pb.ResponseMetadata:
    return pb.ResponseMetadata(
        model=meta.model,
        model_version=meta.version,
        total_tokens=meta.total_tokens,
        input_tokens=meta.input_tokens,
        truncated=meta.truncated,
        queue_time_ms=1000 * meta.queue_s,
        inference_time_ms=1000 * meta.inference_s,
        tokenize_time_ms=1000 * meta.tokenize_s,
        batches=meta.batches,
    )


def tokens(encoded: EncodedInput) -> list[pb.Token]:
    return [
        pb.Token(text=text, id=int(token_id), start=start, end=end, special=special)
        for text, token_id, (start, end), special in zip(
            encoded.tokens, encoded.ids.tolist(), encoded.offsets, encoded.special, strict=True
        )
    ]


def embed(result: EmbedResult, floats: bool = True) -> bytes:
    """EmbedResponse; `floats`: the dense vectors as `values` (the call asked for "float")."""
    return b"".join(embed_parts(result, floats))


def embed_parts(result: EmbedResult, floats: bool = True) -> list[bytes]:
    """EmbedResponse serialized as pieces whose concatenation is the message (joined once by the caller:
    a token-level answer is large, and each join copies it)."""
    dimension = result.dimension or _encoded_dimension(result)
    head = pb.EmbedResponse(dimension=dimension, metadata=metadata(result.meta)).SerializeToString()
    extras = (result.tokens, result.sparse, result.chunks)
    if floats and result.vectors is not None and not result.encodings and all(x is None for x in extras):
        rows = (wire.packed_floats(VALUES_FIELD, vector) for vector in result.vectors)
        return [head, *(wire.length_delimited(EMBEDDINGS_FIELD, row) for row in rows)]
    parts = [head]
    for row in range(_rows(result)):
        parts += _delimited(EMBEDDINGS_FIELD, _embedding_fields(result, row, floats))
    return parts


def _delimited(field_number: int, pieces: list[bytes]) -> list[bytes]:
    """A length-delimited field holding `pieces` (concatenated), as pieces: no copy of them."""
    size = sum(len(piece) for piece in pieces)
    return [wire.varint(field_number << 3 | wire.LENGTH_DELIMITED), wire.varint(size), *pieces]


def _packed(field_number: int, values: np.ndarray, dtype: str = "<f4") -> list[bytes]:
    """A packed repeated field of fixed-size values (or a bytes field), as pieces."""
    return _delimited(field_number, [np.ascontiguousarray(values).astype(dtype, copy=False).tobytes()])


def _rows(result: EmbedResult) -> int:
    for rows in (result.vectors, result.tokens, result.sparse, *result.encodings.values(), result.chunks):
        if rows is not None:
            return len(rows)
    return 0


def _encoded_dimension(result: EmbedResult) -> int:
    """The dense vectors' dimension when only their other encodings were returned."""
    for name in ("float16", "int8", "uint8"):
        if name in result.encodings:
            return int(result.encodings[name].shape[1])
    return 0


def _embedding_fields(result: EmbedResult, row: int, floats: bool) -> list[bytes]:
    """One Embedding's fields, serialized, as pieces."""
    pieces = []
    if floats and result.vectors is not None:
        pieces += _packed(VALUES_FIELD, result.vectors[row])
    for name, array in result.encodings.items():
        if name in ENCODING_FIELDS:
            pieces += _packed(ENCODING_FIELDS[name], array[row], ENCODING_BYTES[name])
    if result.tokens is not None:
        matrix = result.tokens[row]
        count = pb.TokenEmbeddings(count=len(matrix)).SerializeToString()
        pieces += _delimited(TOKENS_FIELD, [count, *_packed(TOKEN_VALUES_FIELD, matrix)])
    if result.sparse is not None:
        ids, weights = result.sparse[row]
        indices = pb.SparseEmbedding(indices=np.asarray(ids).tolist()).SerializeToString()
        pieces += _delimited(SPARSE_FIELD, [indices, *_packed(SPARSE_VALUES_FIELD, weights)])
    if result.chunks is not None:
        pieces.append(pb.Embedding(chunks=result.chunks[row]).SerializeToString())
    return pieces


def fill_mask(result: FillMaskResult) -> bytes:
    results = [
        pb.FillMaskResult(
            masks=[
                pb.MaskPrediction(
                    position=mask.position,
                    candidates=[
                        pb.MaskCandidate(
                            token=token, token_id=int(token_id), score=float(score), sequence=text
                        )
                        for token, token_id, score, text in zip(
                            mask.tokens,
                            mask.token_ids,
                            mask.scores,
                            mask.sequences or [""] * len(mask.tokens),
                            strict=True,
                        )
                    ],
                )
                for mask in masks
            ]
        )
        for masks in result.masks
    ]
    return pb.FillMaskResponse(results=results, metadata=metadata(result.meta)).SerializeToString()


def classify(result: ClassifyResult) -> bytes:
    results = [
        pb.Classification(labels=[pb.LabelScore(label=s.label, index=s.index, score=s.score) for s in labels])
        for labels in result.labels
    ]
    return pb.ClassifyResponse(results=results, metadata=metadata(result.meta)).SerializeToString()


def rerank(result: RerankResult) -> bytes:
    results = [
        pb.RankedDocument(index=r.index, score=r.score, document=r.document or "", truncated=r.truncated)
        for r in result.results
    ]
    response = pb.RerankResponse(results=results, metadata=metadata(result.meta), method=result.method)
    return response.SerializeToString()


def score(result: ScoreResult) -> bytes:
    results = [
        pb.PairScore(score=s, truncated=t)
        for s, t in zip(result.scores.tolist(), result.truncated, strict=True)
    ]
    response = pb.ScoreResponse(results=results, metadata=metadata(result.meta), method=result.method)
    return response.SerializeToString()


def tokenize(result: TokenizeResult) -> bytes:
    results = [pb.TokenizedInput(tokens=tokens(e)) for e in result.inputs]
    return pb.TokenizeResponse(results=results, metadata=metadata(result.meta)).SerializeToString()


def attention(result: AttentionResult) -> bytes:
    head = pb.AttentionResponse(
        tokens=tokens(result.tokens),
        sequence_length=result.tokens.length,
        num_layers=result.num_layers,
        num_heads=result.num_heads,
        metadata=metadata(result.meta),
    ).SerializeToString()
    maps = [
        wire.length_delimited(
            MAPS_FIELD,
            pb.AttentionMap(layer=layer, head=head).SerializeToString()
            + wire.packed_floats(PROBABILITIES_FIELD, result.maps[i, j]),
        )
        for i, layer in enumerate(result.layers)
        for j, head in enumerate(result.heads)
    ]
    return head + b"".join(maps)


def info(server: ServerInfo) -> bytes:
    models = [
        pb.ModelInfo(
            name=m.name,
            version=m.version,
            encoder=m.encoder,
            tasks=m.tasks,
            default_for=m.default_for,
            dimension=m.dimension,
            max_length=m.max_length,
            vocab_size=m.vocab_size,
            num_layers=m.num_layers,
            precision=m.precision,
            provider=m.provider,
            pooling=m.pooling,
            normalize_default=m.normalize_default,
            mask_token=m.mask_token,
            labels=m.labels,
            problem_type=m.problem_type,
            pairs=m.pairs,
            cross_encoder=m.cross_encoder,
            cosine_of=m.cosine_of,
            dimensions=m.dimensions,
            prompts=m.prompts,
            default_prompt_name=m.default_prompt_name,
            encodings=m.encodings,
            sparse=m.sparse,
        )
        for m in server.models
    ]
    limits = pb.Limits(**vars(server.limits))
    response = pb.InfoResponse(
        server_version=server.server_version, models=models, limits=limits, versions=server.versions
    )
    return response.SerializeToString()
