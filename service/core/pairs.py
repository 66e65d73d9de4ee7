"""Rerank and Score (sentence pairs): methods of the inference core (`InferenceCore` inherits them).

A cross-encoder (a classifier with one label; see `ModelRegistry.resolve_pairs`) reads each pair as one
input of its Classify task ([CLS] a [SEP] b [SEP], `ModelTokenizer.encode_pairs`); its score is the model's
activation of the logit (`raw_scores`: the logit). An embedding model scores the cosine of the two texts'
normalized embeddings, each distinct side embedded once (Rerank's query once). Either way the inputs are
ordinary work items of the model's encoder: counted against max_inputs_per_request and admitted before
any work on the texts (`InferenceCore._admitted_run`), then batched with every other call. A cross-encoder
whose manifest has a `fusion` adds an embedding model's cosine of the same pair (`_pair_scores`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from bertserve.service.core.results import CallMeta, RankedDocument, RerankResult, ScoreResult, call_meta
from bertserve.service.core.validation import check_count, check_text, check_texts
from bertserve.service.engine.model_registry import COSINE, CROSS_ENCODER
from bertserve.service.engine.pair_truncation import PairNames, check_strategy
from bertserve.service.engine.queue_room import Permit
from bertserve.service.engine.served_model import ServedModel
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.tasks.classify import label_scores
from bertserve.service.errors import InvalidInput

RERANK_NAMES = PairNames(pair="documents[{i}]", first="query", second="documents[{i}]")
ONE_TO_MANY_NAMES = PairNames(pair="texts_2[{i}]", first="texts_1[0]", second="texts_2[{i}]")
PAIRWISE_NAMES = PairNames(pair="texts_1[{i}] with texts_2[{i}]", first="texts_1[{i}]", second="texts_2[{i}]")
_INPUT = re.compile(r"^inputs\[(\d+)\]")


def check_two_segments(model: ServedModel, field: str) -> None:
    """Refuses pairs, before any work, to a model with one segment embedding (segment id 1 would index past
    it)."""
    if model.manifest.dimensions.type_vocab_size < 2:
        raise InvalidInput(
            f"{field}: model {model.name} has one segment embedding (type_vocab_size 1): it takes single "
            "texts, not sentence pairs"
        )


class PairCalls:
    """Rerank and Score, mixed into `InferenceCore` (this module imports nothing of it): they use its
    `registry`, `settings`, `metrics`, `off_loop`, `_tokenize`, `_tokenize_pairs` and
    `_admitted_run` (room in the queue first, then tokenization, then the run)."""

    async def rerank(
        self,
        model: str,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        return_documents: bool = False,
        raw_scores: bool = False,
        truncate: bool = True,
        deadline: float | None = None,
    ) -> RerankResult:
        """The documents by relevance to the query, best first (ties: lower index first), the first `top_n`
        (None, or more than the documents: all). A cross-encoder reads each (query, document) pair, the
        document cut ("only_second") when `truncate`; an embedding model scores the cosine. `model` "": the
        first cross-encoder, else the default embedding model."""
        served, method = self.registry.resolve_pairs(model)
        if top_n is not None and top_n < 1:
            raise InvalidInput(f"top_n: must be at least 1 (got {top_n})")
        check_count(documents, self.settings.max_inputs_per_request, "documents", "document")
        limit = self.settings.max_input_chars
        docs = list(documents)

        def texts() -> list[str]:
            check_text(query, "query", limit)
            return check_texts(docs, len(docs), limit, "documents")

        n = len(docs)

        def cross(permit: Permit | None, raw: bool):
            pairs = lambda: ([query] * n, texts())  # noqa: E731
            return self._cross_scores(
                served, pairs, n, truncate, "only_second", raw, deadline, RERANK_NAMES, permit
            )

        def cosine(model: ServedModel, permit: Permit | None):
            def name(k: int) -> str:
                return "query" if k == 0 else f"documents[{k - 1}]"

            left, right = [0] * n, list(range(1, n + 1))
            return self._cosine_scores(
                model, lambda: [query, *texts()], left, right, truncate, deadline, name, "documents", permit
            )

        scores, meta = await self._pair_scores(
            served, method, n, n + 1, "documents", raw_scores, deadline, cross, cosine
        )
        order = np.argsort(-scores, kind="stable")[:top_n]
        ranked = [
            RankedDocument(int(i), float(scores[i]), docs[i] if return_documents else None, meta.truncated[i])
            for i in order
        ]
        return RerankResult(ranked, method, meta)

    async def score(
        self,
        model: str,
        texts_1: Sequence[str],
        texts_2: Sequence[str],
        *,
        raw_scores: bool = False,
        truncate: bool = False,
        truncation_strategy: str = "longest_first",
        deadline: float | None = None,
    ) -> ScoreResult:
        """One score per pair: texts_1 of one text against every texts_2, else texts_1[i] with texts_2[i]."""
        served, method = self.registry.resolve_pairs(model)
        limit_inputs = self.settings.max_inputs_per_request
        check_count(texts_1, limit_inputs, "texts_1", "text")
        check_count(texts_2, limit_inputs, "texts_2", "text")
        n = len(texts_2)
        if len(texts_1) not in (1, n):
            raise InvalidInput(
                f"texts_1: {len(texts_1)} texts for {n} texts_2; give one text (scored against every "
                "texts_2) or as many as texts_2"
            )
        check_strategy(truncation_strategy)
        one = len(texts_1) == 1
        limit = self.settings.max_input_chars

        def checked() -> tuple[list[str], list[str]]:
            return check_texts(texts_1, n, limit, "texts_1"), check_texts(texts_2, n, limit, "texts_2")

        def cross(permit: Permit | None, raw: bool):
            def pairs() -> tuple[list[str], list[str]]:
                firsts, seconds = checked()
                return (firsts * n if one else firsts), seconds

            names = ONE_TO_MANY_NAMES if one else PAIRWISE_NAMES
            return self._cross_scores(
                served, pairs, n, truncate, truncation_strategy, raw, deadline, names, permit
            )

        width = len(texts_1)

        def cosine(model: ServedModel, permit: Permit | None):
            left = [0] * n if one else list(range(n))
            right = list(range(width, width + n))

            def name(k: int) -> str:
                return f"texts_1[{k}]" if k < width else f"texts_2[{k - width}]"

            every = lambda: [t for side in checked() for t in side]  # noqa: E731
            return self._cosine_scores(model, every, left, right, truncate, deadline, name, "texts_2", permit)

        scores, meta = await self._pair_scores(
            served, method, n, width + n, "texts_2", raw_scores, deadline, cross, cosine
        )
        return ScoreResult(scores, list(meta.truncated), method, meta)

    async def _pair_scores(
        self,
        served: ServedModel,
        method: str,
        pairs: int,
        texts: int,
        field: str,
        raw_scores: bool,
        deadline: float | None,
        cross: Callable[[Permit | None, bool], Awaitable[tuple[np.ndarray, CallMeta]]],
        cosine: Callable[[ServedModel, Permit | None], Awaitable[tuple[np.ndarray, CallMeta]]],
    ) -> tuple[np.ndarray, CallMeta]:
        """The scores of `pairs` pairs of `texts` distinct texts by `method`: `cross(permit, raw)` gives the
        cross-encoder's (raw: its logits), `cosine(model, permit)` the embedding model's. Fused: room for the
        pairs in the cross-encoder's queue and for the texts in the embedding model's, both taken before any
        work; the logits and cosines are computed at once, a failure of either cancelling the other."""
        if method == CROSS_ENCODER:
            return await cross(None, raw_scores)
        if method == COSINE:
            return await cosine(served, None)
        partner = self.registry.fusion_partners[served.name]
        shared = served.batcher is partner.batcher  # one queue holds both runs' inputs
        self._check_embedded(texts + pairs if shared else texts, field, shared)
        check_two_segments(served, field)
        first = served.batcher.reserve(pairs, False, deadline)
        try:
            second = partner.batcher.reserve(texts, False, deadline)
        except BaseException:
            first.release()
            raise
        tasks = [asyncio.ensure_future(cross(first, True)), asyncio.ensure_future(cosine(partner, second))]
        try:
            (logits, cross_meta), (cosines, cosine_meta) = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)  # the other run stopped before its room is given back
            for task in tasks:
                if not task.cancelled():
                    task.exception()  # retrieved: the first failure is the one raised
            raise
        finally:
            first.release()
            second.release()
        fusion = served.fusion
        fused = fusion.logit_weight * logits + fusion.cosine_weight * cosines + fusion.bias
        activation = "identity" if raw_scores else served.one_label_activation
        scores = label_scores(fused, "regression", False, activation)
        return scores, fused_meta(cross_meta, cosine_meta)

    def _check_embedded(self, count: int, field: str, with_pairs: bool = False) -> None:
        """A call that could never be admitted is refused as the client's mistake, not worth a retry."""
        if count > self.settings.max_queue_inputs:
            what = "texts embedded and pairs, in one queue" if with_pairs else "texts embedded"
            raise InvalidInput(
                f"{field}: these pairs need {count} {what}, more than max_queue_inputs "
                f"{self.settings.max_queue_inputs} (the model's queue); send fewer"
            )

    async def _cross_scores(
        self,
        served: ServedModel,
        pairs: Callable[[], tuple[list[str], list[str]]],
        count: int,
        truncate: bool,
        strategy: str,
        raw_scores: bool,
        deadline: float | None,
        names: PairNames,
        permit: Permit | None = None,
    ) -> tuple[np.ndarray, CallMeta]:
        """A cross-encoder's score of each of `count` pairs (`pairs()` gives them checked): (N,) float32."""
        check_two_segments(served, names.second.split("[")[0])
        options = [TaskOptions(Task.CLASSIFY, top_k=0, raw_scores=raw_scores)]

        async def tokenize():
            firsts, seconds = pairs()
            return await self._tokenize_pairs(served, firsts, seconds, truncate, strategy, names)

        encoded, tokenize_s, results = await self._admitted_run(
            served, options, count, tokenize, deadline, permit=permit
        )
        scores = np.array([r.value[0] for r in results], dtype=np.float32)
        return scores, call_meta(served, encoded, tokenize_s, results)

    async def _cosine_scores(
        self,
        served: ServedModel,
        texts: Callable[[], list[str]],
        left: list[int],
        right: list[int],
        truncate: bool,
        deadline: float | None,
        name: Callable[[int], str],
        field: str,
        permit: Permit | None = None,
    ) -> tuple[np.ndarray, CallMeta]:
        """The cosine of texts[left[i]] and texts[right[i]] per pair, each text embedded once (normalized).
        The metadata is per pair: its tokens are those of its own texts, a text shared by several pairs
        counted with the first; cut if either text was. `name(k)`: the field of text k, for refusals; `field`:
        the request's field of the texts, for a call over max_queue_inputs."""
        options = [TaskOptions(Task.EMBED, normalize=True)]

        async def tokenize():
            try:
                return await self._tokenize(served, texts(), truncate, detailed=False)
            except InvalidInput as exc:  # the tokenizer names inputs[k]: name the request's field
                message = _INPUT.sub(lambda m: name(int(m[1])), str(exc), count=1)
                raise InvalidInput(message) from None

        count = max(left + right) + 1
        self._check_embedded(count, field)
        encoded, tokenize_s, results = await self._admitted_run(
            served, options, count, tokenize, deadline, permit=permit
        )
        vectors = np.stack([r.value for r in results])  # (texts, dimension), rows normalized
        scores = np.einsum("ij,ij->i", vectors[left], vectors[right]).astype(np.float32)
        seen: set[int] = set()
        tokens = []
        for pair in zip(left, right, strict=True):
            tokens.append(sum(encoded[k].length for k in pair if k not in seen))
            seen.update(pair)
        truncated = [encoded[a].truncated or encoded[b].truncated for a, b in zip(left, right, strict=True)]
        meta = call_meta(served, encoded, tokenize_s, results)
        return scores, dataclasses.replace(meta, input_tokens=tokens, truncated=truncated)


def fused_meta(cross: CallMeta, cosine: CallMeta) -> CallMeta:
    """One pair's metadata from both models: its tokens in each, cut if either cut it, both runs' times."""
    return dataclasses.replace(
        cross,
        input_tokens=[a + b for a, b in zip(cross.input_tokens, cosine.input_tokens, strict=True)],
        truncated=[a or b for a, b in zip(cross.truncated, cosine.truncated, strict=True)],
        queue_s=max(cross.queue_s, cosine.queue_s),
        inference_s=cross.inference_s + cosine.inference_s,
        tokenize_s=cross.tokenize_s + cosine.tokenize_s,
        batches=cross.batches + cosine.batches,
    )
