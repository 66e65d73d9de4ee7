"""One loaded model: tokenizer, ONNX sessions, its batcher, and the compute function the batcher runs.

`compute` runs in the batcher's worker thread: it pads the batch, runs the encoder once for every task
in the batch (asking only for the outputs those tasks need), then the small heads on just the rows that
need them, and returns one result per input.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from bertserve.manifest import ENCODER_ATTENTIONS, Manifest
from bertserve.service.attention import AttentionGraph
from bertserve.service.batcher import Batcher, WorkItem
from bertserve.service.repository import ModelFiles
from bertserve.service.runtime import GraphSession
from bertserve.service.tasks import Task
from bertserve.service.tasks.classify import label_scores
from bertserve.service.tasks.embed import finish_embeddings
from bertserve.service.tasks.fill_mask import MaskTop, gather_mask_states, top_k
from bertserve.service.tokenization import ModelTokenizer

TASK_OUTPUT = {
    Task.EMBED: "sentence_embedding",
    Task.FILL_MASK: "last_hidden_state",
    Task.CLASSIFY: "pooler_output",
}


class ServedModel:
    def __init__(self, files: ModelFiles, session_factory: Callable[[str], GraphSession]):
        self.files = files
        self.manifest: Manifest = files.manifest
        self.name = files.name
        self.version = files.version
        self.tokenizer = ModelTokenizer(
            files.tokenizer_path, self.manifest.tokenizer, self.manifest.max_length
        )
        self.encoder = session_factory(str(files.graph_path(files.encoder_key)))
        tasks = self.manifest.tasks
        self.mlm_head = (
            session_factory(str(files.graph_path(tasks.fill_mask.graph))) if tasks.fill_mask else None
        )
        self.classifier_head = (
            session_factory(str(files.graph_path(tasks.classify.graph))) if tasks.classify else None
        )
        # Attention maps, when the repository holds the graph (see service/attention.py).
        self.attention = (
            AttentionGraph(session_factory(str(files.graph_path(ENCODER_ATTENTIONS))), self.name)
            if ENCODER_ATTENTIONS in self.manifest.graphs
            else None
        )
        self.batcher: Batcher | None = None  # set by the server
        self.executor: Executor | None = None  # the worker thread the batcher computes on; set by the server
        self.tasks = [t for t in Task if getattr(tasks, t.value) is not None]
        spec = self.manifest.tokenizer
        self._pad_id = spec.pad_token_id
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
    def provider(self) -> str:
        return self.encoder.provider

    @property
    def precision(self) -> str:
        return self.manifest.graphs[self.files.encoder_key].precision

    def compute(self, batch: list[WorkItem]) -> list[object]:
        """Blocking; runs in the batcher's worker thread."""
        size, longest = len(batch), max(item.length for item in batch)
        input_ids = np.full((size, longest), self._pad_id, dtype=np.int64)  # (B, T)
        attention_mask = np.zeros((size, longest), dtype=np.int64)  # (B, T)
        token_type_ids = np.zeros((size, longest), dtype=np.int64)  # (B, T)
        for row, item in enumerate(batch):
            input_ids[row, : item.length] = item.ids
            attention_mask[row, : item.length] = 1
            token_type_ids[row, : item.length] = item.type_ids
        rows_by_task: dict[Task, list[int]] = {}
        for row, item in enumerate(batch):
            rows_by_task.setdefault(item.options.task, []).append(row)
        outputs = self.encoder.run(
            {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids},
            [TASK_OUTPUT[task] for task in rows_by_task],
        )
        results: list[object] = [None] * size
        if rows := rows_by_task.get(Task.EMBED):
            normalize = np.array([batch[r].options.normalize for r in rows])
            vectors = finish_embeddings(outputs["sentence_embedding"][rows], normalize)  # (n, H)
            for vector, row in zip(vectors, rows, strict=True):
                results[row] = vector
        if rows := rows_by_task.get(Task.FILL_MASK):
            self._fill_masks(batch, rows, outputs["last_hidden_state"], results)
        if rows := rows_by_task.get(Task.CLASSIFY):
            pooled = np.ascontiguousarray(outputs["pooler_output"][rows])  # (n, H)
            logits = self.classifier_head.run({"pooler_output": pooled}, ["logits"])["logits"]  # (n, L)
            problem_type = self.manifest.tasks.classify.problem_type
            for logit_row, row in zip(logits, rows, strict=True):
                results[row] = label_scores(logit_row, problem_type, batch[row].options.raw_scores)
        return results

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
