"""One loaded model: tokenizer, its heads, its attention graph, and the encoder group it runs on.

The encoder itself belongs to an `EncoderGroup` (service/engine/encoders.py), which may serve several models;
`finish` is what the group's compute calls for this model's rows of a batch (blocking, on the group's
worker thread): the task's post-processing and this model's head on just those rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from bertserve.manifest import CosineFusion, Manifest
from bertserve.service.engine.attention import AttentionGraph
from bertserve.service.engine.batcher import Batcher, WorkItem
from bertserve.service.engine.repository import ModelFiles
from bertserve.service.engine.runtime import GraphSession
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.tasks.classify import label_scores, one_label_activation
from bertserve.service.engine.tasks.embed import EmbedOutputs, finish_embeddings
from bertserve.service.engine.tasks.fill_mask import MaskPrediction, MaskTop, gather_mask_states, top_k
from bertserve.service.engine.tasks.sparse import above, splade_weights
from bertserve.service.engine.tokenization import EncodedInput, ModelTokenizer

if TYPE_CHECKING:
    from bertserve.service.engine.encoders import EncoderGroup

CLS_HIDDEN_STATE = "cls_hidden_state"  # a head-only classifier's input: last_hidden_state[:, 0, :]


class ServedModel:
    def __init__(
        self,
        files: ModelFiles,
        session_factory: Callable[[str], GraphSession],
        encoder: EncoderGroup,
        attention: AttentionGraph | None,
        tokenizer: ModelTokenizer | None = None,
        decoder_table: np.ndarray | None = None,
    ):
        """`tokenizer`: one shared with models of the same tokenizer file (made here when None).
        `decoder_table`: a tied mlm_head's decoder weight (V, C), fed to the head on each run."""
        self.files = files
        self.manifest: Manifest = files.manifest
        self.name = files.name
        self.version = files.version
        self.tokenizer = tokenizer or ModelTokenizer(
            files.tokenizer_path, self.manifest.tokenizer, self.manifest.max_length
        )
        self.encoder = encoder
        tasks = self.manifest.tasks
        self.mlm_head = (
            session_factory(str(files.graph_path(tasks.fill_mask.graph))) if tasks.fill_mask else None
        )
        tied = tasks.tied_decoder
        if (tied is None) != (decoder_table is None):
            raise ValueError(f"model {self.name}: a tied mlm_head needs its decoder table, and only it does")
        if tied is not None:  # every run reads this one table (on CPU, not copied; on CUDA, copied once)
            self.mlm_head.set_constant_inputs({tied.input: decoder_table})
        self.classifier_head = (
            session_factory(str(files.graph_path(tasks.classify.graph))) if tasks.classify else None
        )
        # What the classifier head reads: the encoder's pooler_output, or (head-only classifiers that hold
        # their own pooler) the [CLS] row of last_hidden_state.
        self._classifier_input = getattr(tasks.classify, "encoder_output", "pooler_output")
        self.one_label_activation = one_label_activation(tasks.classify)  # a cross-encoder's; None otherwise
        self.attention = attention  # the encoder_attentions graph, if any (see service/engine/attention.py)
        self.tasks = [t for t in Task if getattr(tasks, t.value) is not None]
        spec = self.manifest.tokenizer
        self._skip_when_decoding = {
            i
            for i in (
                self.tokenizer.token_to_id(spec.cls_token),
                self.tokenizer.token_to_id(spec.sep_token),
                spec.pad_token_id,
            )
            if i is not None
        }

    @property
    def fusion(self) -> CosineFusion | None:
        """The embedding model's cosine a cross-encoder's scores add (manifest `cross_encoder.fusion`)."""
        classify = self.manifest.tasks.classify
        return classify.cross_encoder.fusion if classify is not None and classify.cross_encoder else None

    @property
    def cross_encoder(self) -> bool:
        """One score per input (a classifier with one label): answers Rerank and Score."""
        return self.one_label_activation is not None

    @property
    def batcher(self) -> Batcher:
        """The queue owner of this model's encoder (shared with every model on that encoder)."""
        return self.encoder.batcher

    @property
    def provider(self) -> str:
        return self.encoder.provider

    @property
    def precision(self) -> str:
        return self.manifest.graphs[self.files.encoder_key].precision

    def encoder_outputs(self, options: TaskOptions) -> tuple[str, ...]:
        """The encoder outputs a row with these options reads (embed: the pooled vector for dense, the
        token states for token-level and sparse outputs)."""
        if options.task is Task.EMBED:
            dense = ("sentence_embedding",) if options.dense else ()
            return dense + (("last_hidden_state",) if options.tokens or options.sparse else ())
        if options.task is Task.FILL_MASK or self._classifier_input == CLS_HIDDEN_STATE:
            return ("last_hidden_state",)
        return ("pooler_output",)

    def finish(
        self,
        task: Task,
        batch: list[WorkItem],
        rows: list[int],
        outputs: dict[str, np.ndarray],
        results: list,
    ) -> None:
        """Blocking: this model's `task` on `rows` of the batch, from the encoder's `outputs`, into `results`."""
        if task is Task.EMBED:
            self._embed(batch, rows, outputs, results)
        elif task is Task.FILL_MASK:
            self._fill_masks(batch, rows, outputs["last_hidden_state"], results)
        else:
            self._classify(batch, rows, outputs, results)

    def _embed(self, batch: list[WorkItem], rows: list[int], outputs: dict, results: list) -> None:
        """A row's value: its dense vector (D,) when only that is asked, else an EmbedOutputs."""
        dense_rows = [r for r in rows if batch[r].options.dense]
        dense = dict.fromkeys(rows)
        if dense_rows:
            normalize = np.array([batch[r].options.normalize for r in dense_rows])
            dimensions = np.array([batch[r].options.dimensions for r in dense_rows])
            first, last = dense_rows[0], dense_rows[-1]  # ascending: a slice when they follow each other
            pooled = outputs["sentence_embedding"]
            pooled = pooled[first : last + 1] if last - first + 1 == len(dense_rows) else pooled[dense_rows]
            dense.update(zip(dense_rows, finish_embeddings(pooled, normalize, dimensions), strict=True))
        sparse_rows = [r for r in rows if batch[r].options.sparse]
        weights = {}
        if sparse_rows:
            hidden = outputs["last_hidden_state"]  # (B, T, H)
            states = [hidden[r, : batch[r].length] for r in sparse_rows]
            vocab = self.manifest.dimensions.vocab_size
            run = self._mlm_logits
            weights = dict(zip(sparse_rows, splade_weights(run, states, vocab), strict=True))  # (V,) each
        for row in rows:
            options = batch[row].options
            if not (options.tokens or options.sparse):
                results[row] = dense[row]
                continue
            hidden = outputs["last_hidden_state"]
            tokens = (
                hidden[row, : batch[row].length].astype(np.float32, copy=True) if options.tokens else None
            )
            results[row] = EmbedOutputs(
                dense=dense[row],
                tokens=tokens,
                sparse=above(weights[row], options.sparse_threshold) if options.sparse else None,
            )

    def _mlm_logits(self, states: np.ndarray) -> np.ndarray:
        """states (P, H) -> the MLM head's logits (P, V)."""
        return self.mlm_head.run({"hidden_states": states}, ["logits"])["logits"]

    def _classify(self, batch: list[WorkItem], rows: list[int], outputs: dict, results: list) -> None:
        if self._classifier_input == CLS_HIDDEN_STATE:
            feed = {CLS_HIDDEN_STATE: np.ascontiguousarray(outputs["last_hidden_state"][rows, 0])}  # (n, H)
        else:
            feed = {"pooler_output": np.ascontiguousarray(outputs["pooler_output"][rows])}  # (n, H)
        logits = self.classifier_head.run(feed, ["logits"])["logits"]  # (n, L)
        problem_type = self.manifest.tasks.classify.problem_type
        for logit_row, row in zip(logits, rows, strict=True):
            results[row] = label_scores(
                logit_row, problem_type, batch[row].options.raw_scores, self.one_label_activation
            )

    def _fill_masks(self, batch: list[WorkItem], rows: list[int], hidden: np.ndarray, results: list) -> None:
        owners = np.concatenate([np.full(len(batch[r].mask_positions), r) for r in rows])  # (N,)
        positions = np.concatenate([batch[r].mask_positions for r in rows])  # (N,)
        states = gather_mask_states(hidden, owners, positions)  # (N, H)
        logits = self.mlm_head.run({"hidden_states": states}, ["logits"])["logits"]  # (N, V)
        start = 0
        for row in rows:
            item = batch[row]
            count = len(item.mask_positions)
            ids, scores = top_k(logits[start : start + count], item.options.top_k)  # (count, k)
            start += count
            results[row] = [MaskTop(int(p), ids[m], scores[m]) for m, p in enumerate(item.mask_positions)]

    def mask_predictions(
        self, encoded: list[EncodedInput], tops: list[list[MaskTop]], sequences: bool
    ) -> list[list[MaskPrediction]]:
        """Blocking (decodes): the typed fill-mask answer, per input, per mask."""
        filled = self.filled_sequences([e.ids for e in encoded], tops) if sequences else None
        out = []
        for i, masks in enumerate(tops):
            out.append(
                [
                    MaskPrediction(
                        position=mask.position,
                        token_ids=mask.token_ids,
                        tokens=[self.tokenizer.id_to_token(int(t)) for t in mask.token_ids],
                        scores=mask.scores,
                        sequences=filled[i][m] if filled is not None else None,
                    )
                    for m, mask in enumerate(masks)
                ]
            )
        return out

    def filled_sequences(self, inputs: list[np.ndarray], masks: list[list[MaskTop]]) -> list[list[list[str]]]:
        """Per input, per mask, per candidate: the input's text with that mask filled (other masks kept)."""
        variants, shape = [], []
        for ids, input_masks in zip(inputs, masks, strict=True):
            shape.append([len(mask.token_ids) for mask in input_masks])
            for mask in input_masks:
                for candidate in mask.token_ids:
                    filled = ids.copy()
                    filled[mask.position] = candidate
                    variants.append(filled.tolist())
        texts = iter(self.tokenizer.decode(variants, self._skip_when_decoding))
        return [[[next(texts) for _ in range(k)] for k in per_mask] for per_mask in shape]
