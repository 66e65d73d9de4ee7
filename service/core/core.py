"""The protocol-free inference core: tokenization, validation, admission, batching, typed results.

Every front (gRPC bertserve.v1 in `servicer.py`, KServe v2 in `kserve/servicer.py`, HTTP, streaming)
only translates its wire format into one call here and the typed result (`service/core/results.py`) back.
Errors are the domain errors of `service/errors.py`; each protocol maps them to its codes in one place.

Data path of a batched call (embed, fill_mask, classify)::

    front ──> core.embed(model, texts, ...) on the event loop
                ├─ validate the options and the number of texts (check_count)
                ├─ admission BEFORE any work on the texts: room in the encoder's queue (Batcher.reserve:
                │  full -> Overloaded, deadline the queue ahead cannot meet -> DeadlineTooShort; a
                │  stream's request waits for room instead, Batcher.wait_room)
                ├─ validate the texts (check_texts); tokenize: ONE hop to the CPU pool
                ├─ queued with its permit (Batcher.submit)
                ├─ the owner cuts batches across every model and task on that encoder; its worker
                │  thread runs the encoder once per batch, then each model's head on its own rows
                └─ typed result with CallMeta (queue = waiting, inference = compute)

Tokenization (service/core/tokenizing.py) and Attention (service/core/attention_calls.py) are inherited.
Classify takes sentence pairs (`pairs`), tokenized together (`ModelTokenizer.encode_pairs`); Rerank and
Score (service/core/pairs.py, inherited) are Classify or Embed inputs of the same path.

Attention calls are admitted by the same owner (a separate `max_queue_attention` limit, their place taken
before tokenizing) and run on the same worker thread, alternating with batches: a batch waits behind at
most one attention run.

`deadline` arguments are absolute `time.monotonic()` seconds (None: no deadline); `deadline_after`
converts a timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from bertserve import __version__
from bertserve.service.core.attention_calls import AttentionCalls
from bertserve.service.core.chunking import embed_chunked
from bertserve.service.core.embed_inputs import check_token_id_counts, left_truncation
from bertserve.service.core.embed_options import check_embed_answer_size, embed_options, embed_result
from bertserve.service.core.loop_lag import LoopLagMonitor
from bertserve.service.core.pairs import PairCalls, check_two_segments
from bertserve.service.core.prompts import call_prompt
from bertserve.service.core.remote_engine import EngineLink, RemoteBatcher
from bertserve.service.core.results import (
    ClassifyResult,
    EmbedResult,
    FillMaskResult,
    LabelScore,
    ModelInfo,
    ServerInfo,
)
from bertserve.service.core.results import call_meta as _meta
from bertserve.service.core.server_info import library_versions, limits_of, model_info_of
from bertserve.service.core.task_calls import Chunking, ClassifyCall, EmbedCall, FillMaskCall, TaskCall
from bertserve.service.core.tokenizing import TokenizingCalls
from bertserve.service.core.validation import (
    check_count,
    check_fill_mask_response_size,
    check_pair_count,
    check_texts,
    check_top_k,
)
from bertserve.service.engine.batcher import ItemResult, Permit
from bertserve.service.engine.encoders import EncoderGroup, attach_batchers, batch_limits
from bertserve.service.engine.model_registry import ModelRegistry
from bertserve.service.engine.pair_truncation import check_strategy
from bertserve.service.engine.served_model import ServedModel
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.tasks.classify import ranked
from bertserve.service.engine.tokenization import EncodedInput
from bertserve.service.engine.unary_calls import CallInputs, settle
from bertserve.service.errors import InvalidInput
from bertserve.service.metrics import Metrics
from bertserve.service.settings import Settings
from bertserve.service.thread_names import naming

DEFAULT_FILL_MASK_TOP_K = 5
# chunks of a stream in flight at once (admitted, batched) before the first is answered
STREAM_CHUNKS_IN_FLIGHT = 4

T = TypeVar("T")


def deadline_after(seconds: float | None) -> float | None:
    """A timeout in seconds (None: none) as the absolute deadline the core's methods take."""
    return None if seconds is None else time.monotonic() + seconds


class InferenceCore(PairCalls, TokenizingCalls, AttentionCalls):
    """One per server. Create it with the loaded models, `await start()`, call its methods from the event
    loop, `await close()` at the end."""

    def __init__(
        self,
        registry: ModelRegistry,
        settings: Settings,
        metrics: Metrics,
        cpu_executor: Executor,
        engine: EngineLink | None = None,
    ):
        """`engine`: this process is one front of several; the engine process batches and computes."""
        self.registry = registry
        self.encoders: list[EncoderGroup] = registry.encoders
        self.settings = settings
        self.metrics = metrics
        self._cpu = cpu_executor  # tokenization, decoding and large responses, off the event loop
        # more threads for one large call's tokenization (service/core/token_slices.py)
        self.tokenize_threads = settings.tokenize_thread_count()
        self._slices = (
            ThreadPoolExecutor(self.tokenize_threads - 1, "bertserve-tokenize", naming("bs-tokenize"))
            if self.tokenize_threads > 1
            else None
        )
        self.loop_lag = LoopLagMonitor(metrics)
        self.refresh_infos()
        if engine is None:
            attach_batchers(registry, settings, metrics)
        else:
            for group in self.encoders:
                group.batcher = RemoteBatcher(engine, group.name, batch_limits(settings))

    def refresh_infos(self) -> None:
        """The models' information, fixed once loaded (a front's again once the engine names its provider)."""
        registry = self.registry
        self._infos = {m.name: model_info_of(m, registry.default_rpcs(m)) for m in registry.ordered}
        # the loaded models that answer sparse embeddings (an MLM head): named when a model without one is asked
        self.sparse_models = [m.name for m in registry.ordered if m.manifest.tasks.fill_mask is not None]

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Starts every encoder's queue owner and the event-loop lag monitor (on the running loop)."""
        for group in self.encoders:
            group.batcher.start()
        self.loop_lag.start()

    async def close(self, finish_queued: bool = True) -> None:
        """Refuses new calls; finishes the queued ones (or fails them with ShuttingDown at once)."""
        for group in self.encoders:
            if group.batcher.running:
                await (group.batcher.close() if finish_queued else group.batcher.abort())
        await self.loop_lag.stop()

    def shutdown_threads(self) -> None:
        """Stops the encoders' worker threads (after `close`); a computing batch finishes in the background."""
        for group in self.encoders:
            group.executor.shutdown(wait=False, cancel_futures=True)
        if self._slices is not None:
            self._slices.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, fn: Callable[..., T], *args) -> T:
        """Runs `fn(*args)` on the CPU pool (e.g. building and serializing a large response)."""
        return await asyncio.get_running_loop().run_in_executor(self._cpu, fn, *args)

    # --- tasks ---------------------------------------------------------------------------------------

    async def embed(
        self,
        model: str,
        texts: Sequence[str],
        *,
        truncate: bool = False,
        normalize: bool | None = None,
        deadline: float | None = None,
        bulk: bool = False,
        call: EmbedCall | None = None,
        prompt_name: str | None = None,
        truncation_direction: str = "right",
        token_ids: Sequence[Sequence[int]] | None = None,
        chunking: Chunking | None = None,
    ) -> EmbedResult:
        """One embedding per text, in order. `model` "" = the default embedding model; `normalize` None =
        the model's default; `bulk`: a stream's inputs, batched after unary calls' (service/engine/batcher.py).
        `call`: what to return (dimensions, dense/tokens/sparse, encodings; its `normalize` wins);
        `prompt_name`: the model's prompt prepended (None: its default prompt); `truncation_direction`:
        which end a too-long input loses; `token_ids`: the model's own ids instead of `texts` (used as
        given); `chunking`: long inputs embedded window by window and pooled (dense only)."""
        call = call or EmbedCall(normalize)
        if chunking is not None:
            return await embed_chunked(
                self,
                model,
                texts,
                call,
                chunking,
                deadline,
                bulk,
                prompt_name,
                truncation_direction,
                token_ids,
            )
        (result,) = await self.infer(
            model,
            texts,
            [call],
            truncate=truncate,
            deadline=deadline,
            bulk=bulk,
            prompt_name=prompt_name,
            truncation_direction=truncation_direction,
            token_ids=token_ids,
        )
        return result

    async def fill_mask(
        self,
        model: str,
        texts: Sequence[str],
        *,
        truncate: bool = False,
        top_k: int | None = None,
        sequences: bool = True,
        deadline: float | None = None,
    ) -> FillMaskResult:
        """Per text, per mask token, the `top_k` (None: 5) best candidates; `sequences`: also the text
        with each candidate filled in (decoded off the event loop)."""
        call = FillMaskCall(top_k, sequences)
        (result,) = await self.infer(model, texts, [call], truncate=truncate, deadline=deadline)
        return result

    async def classify(
        self,
        model: str,
        texts: Sequence[str],
        *,
        pairs: Sequence[str] | None = None,
        truncate: bool = False,
        truncation_strategy: str = "longest_first",
        top_k: int | None = None,
        raw_scores: bool = False,
        deadline: float | None = None,
    ) -> ClassifyResult:
        """Per text, labels with scores best first: the `top_k` best (None: all labels). `pairs`: sentence
        pairs, the second text of each input (cut by `truncation_strategy` when `truncate`)."""
        call = ClassifyCall(top_k, raw_scores)
        (result,) = await self.infer(
            model,
            texts,
            [call],
            pairs=pairs,
            truncate=truncate,
            truncation_strategy=truncation_strategy,
            deadline=deadline,
        )
        return result

    async def infer(
        self,
        model: str,
        texts: Sequence[str],
        calls: Sequence[TaskCall],
        *,
        pairs: Sequence[str] | None = None,
        truncate: bool = False,
        truncation_strategy: str = "longest_first",
        deadline: float | None = None,
        bulk: bool = False,
        prompt_name: str | None = None,
        truncation_direction: str = "right",
        token_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[EmbedResult | FillMaskResult | ClassifyResult]:
        """Several tasks of one model on the same texts (e.g. KServe outputs of two tasks): tokenized
        once, admitted together (all or none) and batched together, so one encoder run can serve them
        all. One result per call, in order. `model` "" = the default model of the first call's task.
        `pairs` (Classify only): the second text of each input, a sentence pair. `prompt_name`,
        `truncation_direction`, `token_ids`: as `embed`'s (a prompt for embedding calls only). Setting
        `auto_truncate`: a call of embedding tasks alone is cut as if it set `truncate`."""
        served = self._resolve(model, calls)
        options = [self._options(served, call) for call in calls]
        left = left_truncation(truncation_direction)
        embed_only = all(call.task is Task.EMBED for call in calls)
        truncate = truncate or (self.settings.auto_truncate and embed_only)
        prompt = call_prompt(served, prompt_name, embed_only, bool(token_ids))
        if token_ids:
            if texts or pairs:
                raise InvalidInput("token_ids: give either inputs or token_ids, not both")
            settings = self.settings
            check_token_id_counts(token_ids, settings.max_inputs_per_request, settings.max_input_chars)
        else:
            check_count(texts, self.settings.max_inputs_per_request)
        check_strategy(truncation_strategy)  # with pairs or not: a wrong value is never ignored
        if pairs:
            if left:
                raise InvalidInput("truncation_direction: sentence pairs are cut by truncation_strategy")
            check_pair_count(texts, pairs, ("inputs", "pairs"))
            if any(call.task is not Task.CLASSIFY for call in calls):
                raise InvalidInput("pairs: only classify takes sentence pairs")
            check_two_segments(served, "pairs")

        async def tokenize() -> tuple[list[EncodedInput], float]:
            if token_ids:
                return await self._from_token_ids(served, token_ids, truncate, left)
            checked = self._check_texts(texts)  # each text within max_input_chars before its prompt
            if not pairs:
                checked = [prompt + text for text in checked] if prompt else checked
                return await self._tokenize(served, checked, truncate, detailed=False, left=left)
            seconds = check_texts(pairs, len(pairs), self.settings.max_input_chars, "pairs")
            return await self._tokenize_pairs(served, checked, seconds, truncate, truncation_strategy)

        def check(encoded: list[EncodedInput]) -> list[np.ndarray] | None:
            check_embed_answer_size(served, options, encoded, self.settings.max_message_bytes)
            if not any(call.task is Task.FILL_MASK for call in calls):
                return None
            masks = [self._masks(served, i, e) for i, e in enumerate(encoded)]
            for call, option in zip(calls, options, strict=True):
                if call.task is Task.FILL_MASK and call.sequences:
                    sizes = [len(m) for m in masks]
                    shown = texts or [" " * 4 * e.length for e in encoded]  # token ids: ~4 characters each
                    check_fill_mask_response_size(shown, sizes, option.top_k, self.settings.max_message_bytes)
            return masks

        count = len(token_ids) if token_ids else len(texts)
        encoded, tokenize_s, results = await self._admitted_run(
            served, options, count, tokenize, deadline, bulk, check
        )
        n = len(encoded)
        out = []
        for k, (call, option) in enumerate(zip(calls, options, strict=True)):
            mine = results[k * n : (k + 1) * n]
            meta = _meta(served, encoded, tokenize_s, mine)
            values = [r.value for r in mine]
            if call.task is Task.EMBED:
                out.append(embed_result(served, call, option, values, meta))
            elif call.task is Task.FILL_MASK:
                predictions = await self.off_loop(served.mask_predictions, encoded, values, call.sequences)
                out.append(FillMaskResult(predictions, meta))
            else:
                id2label = served.manifest.tasks.classify.id2label
                labels = [
                    [LabelScore(id2label.get(i, str(i)), i, score) for i, score in ranked(v, option.top_k)]
                    for v in values
                ]
                out.append(ClassifyResult(labels, meta))
        return out

    async def _admitted_run(
        self,
        served: ServedModel,
        options: list[TaskOptions],
        count: int,
        tokenize: Callable[[], Awaitable[tuple[list[EncodedInput], float]]],
        deadline: float | None,
        bulk: bool = False,
        check: Callable[[list[EncodedInput]], list[np.ndarray] | None] | None = None,
        permit: Permit | None = None,
    ) -> tuple[list[EncodedInput], float, list[ItemResult]]:
        """Room in the encoder's queue for `count` inputs per option FIRST (a refused call costs no work on
        its texts; a stream's request waits for it), then `tokenize()` (which checks the texts), `check`
        (fill-mask's masks), and the run: (encoded, tokenize seconds, results task by task). When `tokenize`
        gives more inputs than `count` (a chunked call's windows), room for the others is taken then.
        `permit`: that room, taken already by the caller (a non-bulk call's)."""
        batcher = served.encoder.batcher
        inputs = count * len(options)
        if permit is None:
            permit = (
                await batcher.wait_room(inputs, True) if bulk else batcher.reserve(inputs, False, deadline)
            )
        try:
            encoded, tokenize_s = await tokenize()
            needed = len(encoded) * len(options)
            if needed > permit.inputs and bulk:  # waits for all its room holding none: no hold-and-wait
                permit.release()
                permit = await batcher.wait_room(needed, True)
            elif needed > permit.inputs:
                extra = batcher.reserve(needed - permit.inputs, False, deadline)
                permit.inputs += extra.inputs  # one permit for the lane's room: released or handed over once
                extra.hand_over()
            masks = check(encoded) if check is not None else None
            results = await self._run(served, encoded, options, masks, deadline, bulk, permit)
        finally:
            permit.release()  # room not used (the call failed before it was queued)
        return encoded, tokenize_s, results

    async def embed_stream(
        self,
        model: str,
        chunks: AsyncIterable[Sequence[str]],
        *,
        truncate: bool = False,
        normalize: bool | None = None,
        deadline: float | None = None,
        window: int = STREAM_CHUNKS_IN_FLIGHT,
    ) -> AsyncIterator[EmbedResult]:
        """One EmbedResult per chunk of texts, in chunk order, with up to `window` chunks admitted at once
        (so a stream's chunks share batches). A failed chunk raises its error when its turn comes; the
        chunks still in flight are cancelled."""
        pending: list[asyncio.Task[EmbedResult]] = []
        try:
            async for texts in chunks:
                call = self.embed(
                    model, texts, truncate=truncate, normalize=normalize, deadline=deadline, bulk=True
                )
                pending.append(asyncio.ensure_future(call))
                while len(pending) >= window:
                    yield await pending.pop(0)
            while pending:
                yield await pending.pop(0)
        finally:
            for task in pending:
                task.cancel()

    # --- information ---------------------------------------------------------------------------------

    def info(self) -> ServerInfo:
        return ServerInfo(
            __version__, list(self._infos.values()), limits_of(self.settings), library_versions()
        )

    def model_info(self, name: str) -> ModelInfo:
        """The named loaded model's information (ModelNotFound otherwise; "" = the first model)."""
        return self._infos[self.registry.resolve(name, None).name]

    # --- the shared path -----------------------------------------------------------------------------

    def _resolve(self, model: str, calls: Sequence[TaskCall]) -> ServedModel:
        if not calls:
            raise InvalidInput("outputs: at least one task is required")
        served = self.registry.resolve(model, calls[0].task)
        for call in calls[1:]:  # the same model must have every task
            self.registry.resolve(served.name, call.task)
        return served

    def _options(self, model: ServedModel, call: TaskCall) -> TaskOptions:
        """The call's options, checked against the model and with its defaults filled in."""
        if call.task is Task.EMBED:
            return embed_options(model, call, self.sparse_models)
        if call.task is Task.FILL_MASK:
            top_k = DEFAULT_FILL_MASK_TOP_K if call.top_k is None else call.top_k
            check_top_k(top_k, model.tokenizer.vocab_size, "top_k", "vocabulary size")
            return TaskOptions(Task.FILL_MASK, top_k=top_k)
        if call.top_k is not None:
            check_top_k(call.top_k, len(model.manifest.tasks.classify.id2label), "top_k", "number of labels")
        return TaskOptions(Task.CLASSIFY, top_k=call.top_k or 0, raw_scores=call.raw_scores)

    async def _run(
        self,
        model: ServedModel,
        encoded: list[EncodedInput],
        options: list[TaskOptions],
        masks: list[np.ndarray] | None,
        deadline: float | None,
        bulk: bool,
        permit: Permit,
    ) -> list[ItemResult]:
        """Queues the inputs of every task at once in the room `permit` holds in the model's encoder queue
        and awaits every result: task by task, input by input."""
        if not encoded or not options:
            return []
        future = asyncio.get_running_loop().create_future()
        inputs = CallInputs(
            model, [e.ids for e in encoded], [e.type_ids for e in encoded], options, deadline, bulk, masks
        )
        call = model.encoder.batcher.submit_call(inputs, settle(future), permit)
        for option in options:
            self.metrics.inputs_of(model.name, option.task.value).inc(len(encoded))
        try:
            return await future
        finally:
            call.cancel()  # after a failure or a cancel: its inputs still queued are dropped
