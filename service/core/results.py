"""The inference core's typed results (`service/core/core.py`): plain data, no protocol types.

Every front (gRPC bertserve.v1, KServe v2, HTTP, streaming) turns these into its own wire format. Arrays
are numpy; times are seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bertserve.service.engine.tasks.fill_mask import MaskPrediction
from bertserve.service.engine.tokenization import EncodedInput

if TYPE_CHECKING:
    from bertserve.service.engine.batcher import ItemResult
    from bertserve.service.engine.served_model import ServedModel


@dataclass(frozen=True)
class CallMeta:
    """What answered a call and what it cost (the protocol's response metadata)."""

    model: str  # the model that answered
    version: int
    encoder: str  # the encoder (shared graph) the model runs on: the name its batches and metrics carry
    input_tokens: list[int]  # per input, special tokens included, after truncation
    truncated: list[bool]  # per input
    queue_s: float  # longest wait of any of the call's inputs between admission and the start of compute
    inference_s: float  # compute time of the batches (or the attention run) that held the call's inputs
    tokenize_s: float
    batches: int  # how many batches held the call's inputs (0 for Tokenize, 1 for Attention)

    @property
    def total_tokens(self) -> int:
        return sum(self.input_tokens)


def call_meta(
    model: ServedModel, encoded: list[EncodedInput], tokenize_s: float, results: Sequence[ItemResult]
) -> CallMeta:
    """A call's metadata: its inputs' tokens and cuts, and the batches that computed them."""
    batches = {r.batch_id: r.inference_s for r in results}
    return CallMeta(
        model=model.name,
        version=model.version,
        encoder=model.encoder.name,
        input_tokens=[e.length for e in encoded],
        truncated=[e.truncated for e in encoded],
        queue_s=max((r.queue_s for r in results), default=0.0),
        inference_s=sum(batches.values()),
        tokenize_s=tokenize_s,
        batches=len(batches),
    )


@dataclass(frozen=True)
class EmbedResult:
    vectors: np.ndarray | None  # (n, dimension) float32, one row per input, in order; None: dense not asked
    meta: CallMeta
    # the dense vectors in each other encoding asked for: "float16" (n, D) float16, "int8"/"uint8" (n, D),
    # "binary"/"ubinary" (n, ceil(D / 8)) int8/uint8 packed bits
    encodings: dict[str, np.ndarray] = field(default_factory=dict)
    tokens: list[np.ndarray] | None = None  # per input (tokens, hidden) float32, when asked
    sparse: list[tuple[np.ndarray, np.ndarray]] | None = (
        None  # per input (ids ascending, weights), when asked
    )
    chunks: list[int] | None = None  # per input, the windows pooled (chunked calls only)

    @property
    def dimension(self) -> int:
        return int(self.vectors.shape[1]) if self.vectors is not None else 0


@dataclass(frozen=True)
class FillMaskResult:
    masks: list[list[MaskPrediction]]  # per input, per mask in order of appearance
    meta: CallMeta


@dataclass(frozen=True)
class LabelScore:
    label: str
    index: int
    score: float


@dataclass(frozen=True)
class ClassifyResult:
    labels: list[list[LabelScore]]  # per input, best first (top_k of them, or all)
    meta: CallMeta


@dataclass(frozen=True)
class RankedDocument:
    index: int  # the document's position in the request
    score: float  # relevance; higher is better
    document: str | None  # its text, when asked for
    truncated: bool  # its pair (cross-encoder) or its text or the query (cosine) was cut to max_length


@dataclass(frozen=True)
class RerankResult:
    results: list[RankedDocument]  # best first (ties: lower index first), the top_n
    method: str  # "cross_encoder" | "cosine" | "cross_encoder+cosine"
    meta: CallMeta  # per document, in request order


@dataclass(frozen=True)
class ScoreResult:
    scores: np.ndarray  # (N,) float32, one per pair, in order
    truncated: list[bool]  # per pair
    method: str  # "cross_encoder" | "cosine" | "cross_encoder+cosine"
    meta: CallMeta  # per pair, in order


@dataclass(frozen=True)
class TokenizeResult:
    inputs: list[EncodedInput]  # per input: ids, type_ids, tokens, offsets, special, truncated
    meta: CallMeta  # queue/inference zero, batches 0


@dataclass(frozen=True)
class AttentionResult:
    tokens: EncodedInput  # the input's tokens: the rows and columns of every map
    layers: list[int]  # as requested (all when none were named), in request order
    heads: list[int]
    maps: np.ndarray  # (len(layers), len(heads), T, T) float32; row q: how query q attends to every key
    num_layers: int  # the model's
    num_heads: int  # the model's, per layer
    meta: CallMeta


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: int
    encoder: str  # the encoder it runs on (its own name unless it shares another model's encoder)
    tasks: list[str]  # "embed", "fill_mask", "classify", "attention"
    default_for: list[str]  # RPC names this model answers when a request names no model
    dimension: int  # embedding size (hidden size without an embed task)
    max_length: int
    vocab_size: int
    num_layers: int
    num_heads: int
    precision: str
    provider: str
    pooling: str  # "mean" | "cls" | "" (no embed task)
    normalize_default: bool
    mask_token: str  # "" without fill_mask
    labels: list[str]  # by index; [] without classify
    problem_type: str  # "" without classify
    pairs: bool = False  # a classifier trained on sentence pairs (the manifest says)
    cross_encoder: bool = False  # one score per pair (a classifier with one label): answers Rerank and Score
    cosine_of: str = ""  # a cross-encoder whose scores add this embedding model's cosine (manifest fusion)
    dimensions: list[int] = field(default_factory=list)  # Matryoshka sizes besides `dimension`
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str = ""
    encodings: list[str] = field(default_factory=list)  # dense encodings offered ([] without embed)
    sparse: bool = False  # has an MLM head: sparse (SPLADE) embeddings


@dataclass(frozen=True)
class Limits:
    max_inputs_per_request: int
    max_input_chars: int
    max_message_bytes: int
    max_batch_size: int
    max_batch_tokens: int
    max_queue_inputs: int
    max_queue_attention: int
    max_queue_delay_ms: float
    max_masks_per_input: int
    max_padding_ratio: float


@dataclass(frozen=True)
class ServerInfo:
    server_version: str
    models: list[ModelInfo]  # in the server's order
    limits: Limits
    versions: dict[str, str] = field(default_factory=dict)  # onnxruntime, tokenizers, grpcio, protobuf
