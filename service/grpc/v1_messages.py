"""Typed core results (service/core/results.py) -> serialized bertserve.v1 responses (bytes).

The float arrays (embeddings, attention maps) are written with `service/grpc/wire.py` straight from numpy;
everything else through the generated classes. Each function is pure and may run off the event loop.
"""

from __future__ import annotations

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


def embed(result: EmbedResult) -> bytes:
    head = pb.EmbedResponse(dimension=result.dimension, metadata=metadata(result.meta)).SerializeToString()
    rows = (
        wire.length_delimited(EMBEDDINGS_FIELD, wire.packed_floats(VALUES_FIELD, v)) for v in result.vectors
    )
    return head + b"".join(rows)


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
        )
        for m in server.models
    ]
    limits = pb.Limits(**vars(server.limits))
    response = pb.InfoResponse(
        server_version=server.server_version, models=models, limits=limits, versions=server.versions
    )
    return response.SerializeToString()
