from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResponseMetadata(_message.Message):
    __slots__ = ("model", "model_version", "total_tokens", "input_tokens", "truncated", "queue_time_ms", "inference_time_ms", "tokenize_time_ms", "batches")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    model: str
    model_version: int
    total_tokens: int
    input_tokens: _containers.RepeatedScalarFieldContainer[int]
    truncated: _containers.RepeatedScalarFieldContainer[bool]
    queue_time_ms: float
    inference_time_ms: float
    tokenize_time_ms: float
    batches: int
    def __init__(self, model: _Optional[str] = ..., model_version: _Optional[int] = ..., total_tokens: _Optional[int] = ..., input_tokens: _Optional[_Iterable[int]] = ..., truncated: _Optional[_Iterable[bool]] = ..., queue_time_ms: _Optional[float] = ..., inference_time_ms: _Optional[float] = ..., tokenize_time_ms: _Optional[float] = ..., batches: _Optional[int] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("inputs", "model", "normalize", "truncate", "options", "token_ids")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    normalize: bool
    truncate: bool
    options: EmbedOptions
    token_ids: _containers.RepeatedCompositeFieldContainer[TokenIds]
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., normalize: _Optional[bool] = ..., truncate: _Optional[bool] = ..., options: _Optional[_Union[EmbedOptions, _Mapping]] = ..., token_ids: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedOptions(_message.Message):
    __slots__ = ("dimensions", "prompt_name", "truncation_direction", "encodings", "dense", "tokens", "sparse", "sparse_threshold", "chunking")
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_NAME_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_DIRECTION_FIELD_NUMBER: _ClassVar[int]
    ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CHUNKING_FIELD_NUMBER: _ClassVar[int]
    dimensions: int
    prompt_name: str
    truncation_direction: str
    encodings: _containers.RepeatedScalarFieldContainer[str]
    dense: bool
    tokens: bool
    sparse: bool
    sparse_threshold: float
    chunking: Chunking
    def __init__(self, dimensions: _Optional[int] = ..., prompt_name: _Optional[str] = ..., truncation_direction: _Optional[str] = ..., encodings: _Optional[_Iterable[str]] = ..., dense: _Optional[bool] = ..., tokens: _Optional[bool] = ..., sparse: _Optional[bool] = ..., sparse_threshold: _Optional[float] = ..., chunking: _Optional[_Union[Chunking, _Mapping]] = ...) -> None: ...

class Chunking(_message.Message):
    __slots__ = ("length", "overlap", "pooling")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    length: int
    overlap: int
    pooling: str
    def __init__(self, length: _Optional[int] = ..., overlap: _Optional[int] = ..., pooling: _Optional[str] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values", "float16", "int8", "uint8", "binary", "ubinary", "tokens", "sparse", "chunks")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    FLOAT16_FIELD_NUMBER: _ClassVar[int]
    INT8_FIELD_NUMBER: _ClassVar[int]
    UINT8_FIELD_NUMBER: _ClassVar[int]
    BINARY_FIELD_NUMBER: _ClassVar[int]
    UBINARY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    float16: bytes
    int8: bytes
    uint8: bytes
    binary: bytes
    ubinary: bytes
    tokens: TokenEmbeddings
    sparse: SparseEmbedding
    chunks: int
    def __init__(self, values: _Optional[_Iterable[float]] = ..., float16: _Optional[bytes] = ..., int8: _Optional[bytes] = ..., uint8: _Optional[bytes] = ..., binary: _Optional[bytes] = ..., ubinary: _Optional[bytes] = ..., tokens: _Optional[_Union[TokenEmbeddings, _Mapping]] = ..., sparse: _Optional[_Union[SparseEmbedding, _Mapping]] = ..., chunks: _Optional[int] = ...) -> None: ...

class TokenEmbeddings(_message.Message):
    __slots__ = ("count", "values")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    count: int
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, count: _Optional[int] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class SparseEmbedding(_message.Message):
    __slots__ = ("indices", "values")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "dimension", "metadata")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    dimension: int
    metadata: ResponseMetadata
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., dimension: _Optional[int] = ..., metadata: _Optional[_Union[ResponseMetadata, _Mapping]] = ...) -> None: ...

class FillMaskRequest(_message.Message):
    __slots__ = ("inputs", "model", "top_k", "truncate")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    top_k: int
    truncate: bool
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., top_k: _Optional[int] = ..., truncate: _Optional[bool] = ...) -> None: ...

class MaskCandidate(_message.Message):
    __slots__ = ("token", "token_id", "score", "sequence")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    token: str
    token_id: int
    score: float
    sequence: str
    def __init__(self, token: _Optional[str] = ..., token_id: _Optional[int] = ..., score: _Optional[float] = ..., sequence: _Optional[str] = ...) -> None: ...

class MaskPrediction(_message.Message):
    __slots__ = ("position", "candidates")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    position: int
    candidates: _containers.RepeatedCompositeFieldContainer[MaskCandidate]
    def __init__(self, position: _Optional[int] = ..., candidates: _Optional[_Iterable[_Union[MaskCandidate, _Mapping]]] = ...) -> None: ...

class FillMaskResult(_message.Message):
    __slots__ = ("masks",)
    MASKS_FIELD_NUMBER: _ClassVar[int]
    masks: _containers.RepeatedCompositeFieldContainer[MaskPrediction]
    def __init__(self, masks: _Optional[_Iterable[_Union[MaskPrediction, _Mapping]]] = ...) -> None: ...

class FillMaskResponse(_message.Message):
    __slots__ = ("results", "metadata")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[FillMaskResult]
    metadata: ResponseMetadata
    def __init__(self, results: _Optional[_Iterable[_Union[FillMaskResult, _Mapping]]] = ..., metadata: _Optional[_Union[ResponseMetadata, _Mapping]] = ...) -> None: ...

class ClassifyRequest(_message.Message):
    __slots__ = ("inputs", "model", "top_k", "raw_scores", "truncate", "pairs", "truncation_strategy")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    top_k: int
    raw_scores: bool
    truncate: bool
    pairs: _containers.RepeatedScalarFieldContainer[str]
    truncation_strategy: str
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., top_k: _Optional[int] = ..., raw_scores: _Optional[bool] = ..., truncate: _Optional[bool] = ..., pairs: _Optional[_Iterable[str]] = ..., truncation_strategy: _Optional[str] = ...) -> None: ...

class LabelScore(_message.Message):
    __slots__ = ("label", "index", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: str
    index: int
    score: float
    def __init__(self, label: _Optional[str] = ..., index: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class Classification(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[LabelScore]
    def __init__(self, labels: _Optional[_Iterable[_Union[LabelScore, _Mapping]]] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("results", "metadata")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Classification]
    metadata: ResponseMetadata
    def __init__(self, results: _Optional[_Iterable[_Union[Classification, _Mapping]]] = ..., metadata: _Optional[_Union[ResponseMetadata, _Mapping]] = ...) -> None: ...

class RerankRequest(_message.Message):
    __slots__ = ("query", "documents", "model", "top_n", "return_documents", "raw_scores", "truncate")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    RETURN_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    query: str
    documents: _containers.RepeatedScalarFieldContainer[str]
    model: str
    top_n: int
    return_documents: bool
    raw_scores: bool
    truncate: bool
    def __init__(self, query: _Optional[str] = ..., documents: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., top_n: _Optional[int] = ..., return_documents: _Optional[bool] = ..., raw_scores: _Optional[bool] = ..., truncate: _Optional[bool] = ...) -> None: ...

class RankedDocument(_message.Message):
    __slots__ = ("index", "score", "document", "truncated")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    index: int
    score: float
    document: str
    truncated: bool
    def __init__(self, index: _Optional[int] = ..., score: _Optional[float] = ..., document: _Optional[str] = ..., truncated: _Optional[bool] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("results", "metadata", "method")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RankedDocument]
    metadata: ResponseMetadata
    method: str
    def __init__(self, results: _Optional[_Iterable[_Union[RankedDocument, _Mapping]]] = ..., metadata: _Optional[_Union[ResponseMetadata, _Mapping]] = ..., method: _Optional[str] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("texts_1", "texts_2", "model", "raw_scores", "truncate", "truncation_strategy")
    TEXTS_1_FIELD_NUMBER: _ClassVar[int]
    TEXTS_2_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    texts_1: _containers.RepeatedScalarFieldContainer[str]
    texts_2: _containers.RepeatedScalarFieldContainer[str]
    model: str
    raw_scores: bool
    truncate: bool
    truncation_strategy: str
    def __init__(self, texts_1: _Optional[_Iterable[str]] = ..., texts_2: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., raw_scores: _Optional[bool] = ..., truncate: _Optional[bool] = ..., truncation_strategy: _Optional[str] = ...) -> None: ...

class PairScore(_message.Message):
    __slots__ = ("score", "truncated")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    score: float
    truncated: bool
    def __init__(self, score: _Optional[float] = ..., truncated: _Optional[bool] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("results", "metadata", "method")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PairScore]
    metadata: ResponseMetadata
    method: str
    def __init__(self, results: _Optional[_Iterable[_Union[PairScore, _Mapping]]] = ..., metadata: _Optional[_Union[ResponseMetadata, _Mapping]] = ..., method: _Optional[str] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("inputs", "model", "truncate")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    truncate: bool
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., truncate: _Optional[bool] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("text", "id", "start", "end", "special")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_FIELD_NUMBER: _ClassVar[int]
    text: str
    id: int
    start: int
    end: int
    special: bool
    def __init__(self, text: _Optional[str] = ..., id: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., special: _Optional[bool] = ...) -> None: ...

class TokenizedInput(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    def __init__(self, tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("results", "metadata")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TokenizedInput]
    metadata: ResponseMetadata
    def __init__(self, results: _Optional[_Iterable[_Union[TokenizedInput, _Mapping]]] = ..., metadata: _Optional[_Union[ResponseMetadata, _Mapping]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "version", "tasks", "default_for", "dimension", "max_length", "vocab_size", "num_layers", "precision", "provider", "pooling", "normalize_default", "mask_token", "labels", "problem_type", "encoder", "pairs", "cross_encoder", "dimensions", "prompts", "default_prompt_name", "encodings", "sparse", "cosine_of")
    class PromptsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FOR_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    MASK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_TYPE_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    CROSS_ENCODER_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PROMPT_NAME_FIELD_NUMBER: _ClassVar[int]
    ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    COSINE_OF_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    tasks: _containers.RepeatedScalarFieldContainer[str]
    default_for: _containers.RepeatedScalarFieldContainer[str]
    dimension: int
    max_length: int
    vocab_size: int
    num_layers: int
    precision: str
    provider: str
    pooling: str
    normalize_default: bool
    mask_token: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    problem_type: str
    encoder: str
    pairs: bool
    cross_encoder: bool
    dimensions: _containers.RepeatedScalarFieldContainer[int]
    prompts: _containers.ScalarMap[str, str]
    default_prompt_name: str
    encodings: _containers.RepeatedScalarFieldContainer[str]
    sparse: bool
    cosine_of: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., tasks: _Optional[_Iterable[str]] = ..., default_for: _Optional[_Iterable[str]] = ..., dimension: _Optional[int] = ..., max_length: _Optional[int] = ..., vocab_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., precision: _Optional[str] = ..., provider: _Optional[str] = ..., pooling: _Optional[str] = ..., normalize_default: _Optional[bool] = ..., mask_token: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., problem_type: _Optional[str] = ..., encoder: _Optional[str] = ..., pairs: _Optional[bool] = ..., cross_encoder: _Optional[bool] = ..., dimensions: _Optional[_Iterable[int]] = ..., prompts: _Optional[_Mapping[str, str]] = ..., default_prompt_name: _Optional[str] = ..., encodings: _Optional[_Iterable[str]] = ..., sparse: _Optional[bool] = ..., cosine_of: _Optional[str] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_inputs_per_request", "max_input_chars", "max_message_bytes", "max_batch_size", "max_batch_tokens", "max_queue_inputs", "max_queue_delay_ms", "max_masks_per_input", "max_padding_ratio", "max_queue_attention")
    MAX_INPUTS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_INPUTS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MASKS_PER_INPUT_FIELD_NUMBER: _ClassVar[int]
    MAX_PADDING_RATIO_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_ATTENTION_FIELD_NUMBER: _ClassVar[int]
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
    def __init__(self, max_inputs_per_request: _Optional[int] = ..., max_input_chars: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., max_batch_tokens: _Optional[int] = ..., max_queue_inputs: _Optional[int] = ..., max_queue_delay_ms: _Optional[float] = ..., max_masks_per_input: _Optional[int] = ..., max_padding_ratio: _Optional[float] = ..., max_queue_attention: _Optional[int] = ...) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("server_version", "models", "limits", "versions")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    limits: Limits
    versions: _containers.ScalarMap[str, str]
    def __init__(self, server_version: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., versions: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AttentionRequest(_message.Message):
    __slots__ = ("input", "model", "layers", "heads", "truncate")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    input: str
    model: str
    layers: _containers.RepeatedScalarFieldContainer[int]
    heads: _containers.RepeatedScalarFieldContainer[int]
    truncate: bool
    def __init__(self, input: _Optional[str] = ..., model: _Optional[str] = ..., layers: _Optional[_Iterable[int]] = ..., heads: _Optional[_Iterable[int]] = ..., truncate: _Optional[bool] = ...) -> None: ...

class AttentionMap(_message.Message):
    __slots__ = ("layer", "head", "probabilities")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    layer: int
    head: int
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, layer: _Optional[int] = ..., head: _Optional[int] = ..., probabilities: _Optional[_Iterable[float]] = ...) -> None: ...

class AttentionResponse(_message.Message):
    __slots__ = ("tokens", "sequence_length", "num_layers", "num_heads", "maps", "metadata")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    MAPS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    sequence_length: int
    num_layers: int
    num_heads: int
    maps: _containers.RepeatedCompositeFieldContainer[AttentionMap]
    metadata: ResponseMetadata
    def __init__(self, tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ..., sequence_length: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_heads: _Optional[int] = ..., maps: _Optional[_Iterable[_Union[AttentionMap, _Mapping]]] = ..., metadata: _Optional[_Union[ResponseMetadata, _Mapping]] = ...) -> None: ...

class EmbedStreamRequest(_message.Message):
    __slots__ = ("id", "inputs", "model", "normalize", "truncate", "stop_on_error", "options", "token_ids")
    ID_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    STOP_ON_ERROR_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    id: int
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    normalize: bool
    truncate: bool
    stop_on_error: bool
    options: EmbedOptions
    token_ids: _containers.RepeatedCompositeFieldContainer[TokenIds]
    def __init__(self, id: _Optional[int] = ..., inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., normalize: _Optional[bool] = ..., truncate: _Optional[bool] = ..., stop_on_error: _Optional[bool] = ..., options: _Optional[_Union[EmbedOptions, _Mapping]] = ..., token_ids: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ...) -> None: ...

class StreamError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class EmbedStreamResponse(_message.Message):
    __slots__ = ("id", "result", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    result: EmbedResponse
    error: StreamError
    def __init__(self, id: _Optional[int] = ..., result: _Optional[_Union[EmbedResponse, _Mapping]] = ..., error: _Optional[_Union[StreamError, _Mapping]] = ...) -> None: ...
