"""The models a server holds, the encoder groups they run on, and which model answers a request that
names none. `load` reads the repository and creates every ONNX Runtime session, each encoder graph
(and attention graph) once per sha256."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bertserve.manifest import ENCODER_ATTENTIONS, TokenizerSpec
from bertserve.service.engine import cuda_sync
from bertserve.service.engine.attention import AttentionGraph
from bertserve.service.engine.encoders import EncoderGroup
from bertserve.service.engine.repository import ModelFiles, discover
from bertserve.service.engine.runtime import EngineSession, GraphSession
from bertserve.service.engine.served_model import ServedModel
from bertserve.service.engine.simulated_device import SimulatedSession
from bertserve.service.engine.tasks import Task
from bertserve.service.engine.tokenization import ModelTokenizer
from bertserve.service.errors import ModelNotFound, StartupError, TaskUnavailable
from bertserve.service.settings import Settings, shares_session

log = logging.getLogger(__name__)

# how Rerank and Score score a pair (their `method`); FUSED: a cross-encoder whose score adds a cosine
CROSS_ENCODER, COSINE, FUSED = "cross_encoder", "cosine", "cross_encoder+cosine"


def _encoder_identity(files: ModelFiles) -> tuple[str, str, str]:
    """(graph path, sha256, name of the model the encoder belongs to) for the chosen precision."""
    path = getattr(files, "encoder_path", None) or files.graph_path(files.encoder_key)
    sha256 = getattr(files, "encoder_sha256", None) or files.manifest.graphs[files.encoder_key].sha256
    return str(path), sha256, getattr(files, "encoder_name", files.name)


def _encoder_names(found: list[ModelFiles]) -> dict[str, str]:
    """sha256 -> the name an encoder goes by (in Info, CallMeta and the batch metrics' `model` label): the
    model the repository says it belongs to (a head-only model names it). Among byte-identical copies in
    several full models: the first model, in the server's order, that has no head (the plain encoder
    model), else the first model that uses it."""
    names: dict[str, str] = {}
    for headless_first in (True, False):
        for files in found:
            _, sha256, owner = _encoder_identity(files)
            tasks = files.manifest.tasks
            if headless_first and (owner != files.name or tasks.fill_mask or tasks.classify):
                continue
            names.setdefault(sha256, owner)
    return names


def _decoder_tables(found: list[ModelFiles]) -> dict[str, np.ndarray]:
    """Tied decoder tables by sha256, each loaded once (its file's sha256 was checked by `discover`)."""
    tables: dict[str, np.ndarray] = {}
    for files in found:
        tied = files.manifest.tasks.tied_decoder
        if tied is None or tied.sha256 in tables:
            continue
        table = np.load(files.decoder_table_path, allow_pickle=False)
        if table.dtype != np.dtype(tied.dtype) or list(table.shape) != tied.shape:
            raise StartupError(
                f"{files.decoder_table_path}: {table.dtype} {list(table.shape)}, the manifest says "
                f"{tied.dtype} {tied.shape}"
            )
        tables[tied.sha256] = np.ascontiguousarray(table)
    return tables


def _placeholder_tables(found: list[ModelFiles]) -> dict[str, np.ndarray]:
    """What a front holds for each tied decoder table: nothing (the engine holds the tables)."""
    tied = (files.manifest.tasks.tied_decoder for files in found)
    return {t.sha256: np.empty((0, 0), np.float32) for t in tied if t is not None}


def _shared_initializers(found: list[ModelFiles], tables: dict[str, np.ndarray]) -> dict[str, dict]:
    """Graph sha256 -> {initializer name: table}: the encoder graphs whose word-embedding table is a served
    tied decoder's (bit-identical, checked at export), so their sessions take that one array."""
    shared: dict[str, dict[str, np.ndarray]] = {}
    for files in found:
        tied = files.manifest.tasks.tied_decoder
        for key, initializer in tied.encoder_initializers.items() if tied is not None else ():
            if key in files.manifest.graphs:
                shared.setdefault(files.manifest.graphs[key].sha256, {})[initializer] = tables[tied.sha256]
    return shared


def _instances(settings: Settings, new_session: Callable[[], GraphSession]) -> list[GraphSession]:
    """The encoder's `instances`: one session run by every instance (shared), or a session each."""
    first = new_session()
    return (
        [first] * settings.instances
        if shares_session(settings.instance_sessions, first.device)
        else [first, *(new_session() for _ in range(settings.instances - 1))]
    )


def load(settings: Settings, front: bool = False) -> ModelRegistry:
    """Blocking: checks the repository and creates every session; encoders deduplicated by sha256, and so
    are tokenizers (by file sha256 and max_length) and tied decoder tables (held once, see TiedDecoder).
    `front`: a front process of several (the engine process runs the graphs): no sessions, no tables."""
    if settings.cuda_graphs == "on" and (settings.batch_shapes == "exact" or settings.instances > 1):
        raise StartupError("cuda_graphs on needs batch shapes (batch_shapes buckets or auto) and instances 1")
    found = discover(settings.model_repo, settings.model_specs(), settings.precision)
    if not front:  # before the first session makes the CUDA context
        cuda_sync.configure(settings.cuda_sync, settings.provider)
    tables = _placeholder_tables(found) if front else _decoder_tables(found)
    shared_initializers = {} if front else _shared_initializers(found, tables)

    def session(
        path: str, sha256: str | None = None, device: bool = False, encoder: bool = False
    ) -> GraphSession | SimulatedSession | EngineSession:
        """`device`: an encoder or attention graph (not a head), which a simulated device answers instead
        of running; `encoder`: the encoder graph itself, whose bucketed batches may be CUDA graphs."""
        if front:
            return EngineSession(path)
        real = GraphSession(
            path,
            settings.provider,
            settings.intra_op_threads,
            settings.inter_op_threads,
            initializers=shared_initializers.get(sha256),
            # one instance: its batches run on one thread, where ONNX Runtime keeps the captured graphs
            cuda_graphs=settings.cuda_graphs if encoder and settings.instances == 1 else "off",
        )
        if device and settings.simulated_device_ms > 0:
            where = "/".join(Path(path).parts[-3:])  # NAME/VERSION/file.onnx
            log.warning(
                "%s: simulated device, never run (%g ms per batch, %g us per padded token)",
                where, settings.simulated_device_ms, settings.simulated_device_us_per_token,
            )  # fmt: skip
            return SimulatedSession(
                real, settings.simulated_device_ms, where, settings.simulated_device_us_per_token
            )
        return real

    tokenizers: dict[tuple[TokenizerSpec, int], ModelTokenizer] = {}
    names = _encoder_names(found)
    groups: dict[str, EncoderGroup] = {}
    attention_graphs: dict[str, AttentionGraph] = {}
    models = []
    for files in found:
        if settings.max_batch_tokens < files.manifest.max_length:
            raise StartupError(
                f"setting max_batch_tokens ({settings.max_batch_tokens}) is less than model "
                f"{files.name}'s max_length {files.manifest.max_length}"
            )
        path, sha256, _ = _encoder_identity(files)
        if sha256 not in groups:
            pad_id = files.manifest.tokenizer.pad_token_id
            instances = _instances(settings, functools.partial(session, path, sha256, True, True))
            groups[sha256] = EncoderGroup(names[sha256], sha256, files.encoder_key, instances, pad_id)
        group = groups[sha256]
        attention = None
        if ENCODER_ATTENTIONS in files.manifest.graphs:
            key = files.manifest.graphs[ENCODER_ATTENTIONS].sha256
            if key not in attention_graphs:
                attention_graphs[key] = AttentionGraph(
                    session(str(files.graph_path(ENCODER_ATTENTIONS)), key, True), files.name
                )
            attention = attention_graphs[key]
        spec, max_length = files.manifest.tokenizer, files.manifest.max_length
        tokenizer_key = (spec, max_length)  # the spec holds the file's sha256
        if tokenizer_key not in tokenizers:
            tokenizers[tokenizer_key] = ModelTokenizer(
                files.tokenizer_path, spec, max_length, settings.native_tokenizer
            )
        tied = files.manifest.tasks.tied_decoder
        table = tables[tied.sha256] if tied is not None else None
        model = ServedModel(files, session, group, attention, tokenizers[tokenizer_key], table)
        group.models.append(model)
        models.append(model)
        log.info("model %s runs on encoder %s (sha256 %s...)", model.name, group.name, sha256[:12])
    return ModelRegistry(models, list(groups.values()))


def _cosine_model(model: ServedModel) -> bool:
    """An embedding model that Rerank and Score may name: a classifier of several labels is refused."""
    classify = model.manifest.tasks.classify
    return Task.EMBED in model.tasks and (classify is None or len(classify.id2label) == 1)


def _fusion_partner(model: ServedModel, by_name: dict[str, ServedModel]) -> ServedModel:
    """The embedding model a fused cross-encoder adds the cosine of; refuses to start without it, or with
    softmax (over one label it is 1: the sum would be lost)."""
    if model.one_label_activation not in ("sigmoid", "identity"):
        raise StartupError(
            f"model {model.name}: a cosine fusion needs a sigmoid or identity activation "
            f"(its manifest has {model.one_label_activation})"
        )
    name = model.fusion.embedding_model
    partner = by_name.get(name)
    if partner is None or not _cosine_model(partner):
        raise StartupError(
            f"model {model.name}: its scores add the cosine of embedding model {name!r}, which is not "
            f"served here (serve both: the models setting, or the whole repository)"
        )
    return partner


class ModelRegistry:
    def __init__(self, models: list[ServedModel], encoders: list[EncoderGroup] | None = None):
        self.ordered = list(models)  # the order of the `models` setting, else by name
        self.encoders = list(encoders or [])  # each distinct encoder graph once, in first-use order
        self.by_name = {m.name: m for m in models}
        # The default for a task: the first model (in order) that has it; for Classify, the first
        # classifier that is not a cross-encoder (one score per input) when there is one.
        self.defaults: dict[Task, ServedModel] = {}
        for model in self.ordered:
            for task in model.tasks:
                self.defaults.setdefault(task, model)
        classifiers = [m for m in self.ordered if not m.cross_encoder and Task.CLASSIFY in m.tasks]
        if classifiers:
            self.defaults[Task.CLASSIFY] = classifiers[0]
        # Rerank and Score: the first cross-encoder, else the first model whose embeddings they may score
        # by cosine (an embed task and no classify task of several labels, as `resolve_pairs` takes).
        cosine = next((m for m in self.ordered if _cosine_model(m)), None)
        self.pairs_default = next((m for m in self.ordered if m.cross_encoder), cosine)
        # A cross-encoder whose score adds an embedding model's cosine: that model, served here too.
        self.fusion_partners = {m.name: _fusion_partner(m, self.by_name) for m in models if m.fusion}
        # Attention: the first model (in order) whose repository holds the encoder_attentions graph.
        self.attention_default = next((m for m in self.ordered if m.attention is not None), None)

    def resolve(self, name: str, task: Task | None) -> ServedModel:
        """The named model, or the default for `task` (None: any model, e.g. for Tokenize)."""
        if name:
            model = self.by_name.get(name)
            if model is None:
                known = ", ".join(self.by_name)
                raise ModelNotFound(f"model: no model named {name[:64]!r} is loaded (loaded: {known})")
            if task is not None and task not in model.tasks:
                have = ", ".join(t.value for t in model.tasks) or "none"
                raise TaskUnavailable(f"model {name}: has no {task.value} task (tasks: {have})")
            return model
        if task is None:
            return self.ordered[0]
        model = self.defaults.get(task)
        if model is None:
            raise TaskUnavailable(f"model: no loaded model has a {task.value} task")
        return model

    def resolve_attention(self, name: str) -> ServedModel:
        """The named model, or the default for Attention; it must have the encoder_attentions graph."""
        model = self.resolve(name, None) if name else self.attention_default
        if model is None:
            raise TaskUnavailable(
                "model: no loaded model has an encoder_attentions graph (export one with --attentions)"
            )
        if model.attention is None:
            raise TaskUnavailable(
                f"model {model.name}: has no encoder_attentions graph, which Attention needs "
                "(export it with `bertserve export --attentions`)"
            )
        return model

    def resolve_pairs(self, name: str) -> tuple[ServedModel, str]:
        """The model that answers Rerank and Score (`name` "" = the default) and how it scores a pair:
        "cross_encoder" (a classifier with one label), "cross_encoder+cosine" (one whose manifest adds an
        embedding model's cosine: `fusion_partners`) or "cosine" (an embedding model)."""
        if not name:
            model = self.pairs_default
            if model is None:
                raise TaskUnavailable(
                    "model: no loaded model is a cross-encoder (a classifier of one label) or an embedding "
                    "model without a classify task of several labels, which Rerank and Score need"
                )
            return model, self._pair_method(model)
        model = self.resolve(name, None)
        if model.cross_encoder:
            return model, self._pair_method(model)
        if Task.CLASSIFY in model.tasks:
            labels = len(model.manifest.tasks.classify.id2label)
            raise TaskUnavailable(
                f"model {model.name}: has {labels} labels; Rerank and Score need one score per pair "
                "(a cross-encoder) or an embedding model"
            )
        if Task.EMBED in model.tasks:
            return model, COSINE
        have = ", ".join(t.value for t in model.tasks) or "none"
        raise TaskUnavailable(
            f"model {model.name}: is neither a cross-encoder nor an embedding model (tasks: {have}), which "
            "Rerank and Score need"
        )

    def _pair_method(self, model: ServedModel) -> str:
        if model.name in self.fusion_partners:
            return FUSED
        return CROSS_ENCODER if model.cross_encoder else COSINE

    def default_rpcs(self, model: ServedModel) -> list[str]:
        rpc = {Task.EMBED: "Embed", Task.FILL_MASK: "FillMask", Task.CLASSIFY: "Classify"}
        names = [rpc[t] for t, m in self.defaults.items() if m is model]
        if model is self.ordered[0]:
            names.append("Tokenize")
        if model is self.attention_default:
            names.append("Attention")
        if model is self.pairs_default:
            names += ["Rerank", "Score"]
        return names
