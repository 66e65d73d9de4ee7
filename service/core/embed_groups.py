"""Plain embedding calls taken in groups (the native gRPC transport's calls: service/grpc/native/), so the
core's Python work is per group rather than per call: each call is checked as `InferenceCore.embed` checks
it, the group's texts are tokenized in one pass per model, and each call is admitted to its encoder's queue
as `embed` admits it (all its inputs or none) and batched with every other front's inputs.

A plain call has texts, a model, normalize and truncate; anything else goes through `embed`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from bertserve.service.core.embed_options import check_embed_answer_size, embed_options, embed_result
from bertserve.service.core.prompts import call_prompt
from bertserve.service.core.results import EmbedResult, call_meta
from bertserve.service.core.task_calls import EmbedCall
from bertserve.service.core.validation import check_texts
from bertserve.service.engine.batcher import WorkItem
from bertserve.service.engine.served_model import ServedModel
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.tokenization import EncodedInput
from bertserve.service.errors import InvalidInput, ServiceError, ShuttingDown


@dataclass(frozen=True)
class PlainEmbed:
    model: str  # "" = the default embedding model
    texts: list[str]
    normalize: bool | None  # None: the model's default
    truncate: bool
    deadline: float | None  # time.monotonic() seconds


@dataclass
class Prepared:
    """A checked, tokenized call, ready for `EmbedGroups.submit`."""

    served: ServedModel
    call: EmbedCall
    option: TaskOptions
    encoded: list[EncodedInput]
    deadline: float | None
    tokenize_s: float


class EmbedGroups:
    def __init__(self, core):
        """`core`: the InferenceCore whose models, settings, metrics and queues the calls use."""
        self.core = core
        self.settings = core.settings

    def prepare(self, calls: list[PlainEmbed]) -> list[Prepared | ServiceError]:
        """Blocking (tokenization; run it off the event loop): per call, its Prepared or why it is refused."""
        out: list[Prepared | ServiceError | None] = [None] * len(calls)
        texts: dict[ServedModel, list[tuple[int, list[str]]]] = {}
        checked: dict[int, tuple[ServedModel, EmbedCall, TaskOptions]] = {}
        s = self.settings
        for i, plain in enumerate(calls):
            try:
                served = self.core.registry.resolve(plain.model, Task.EMBED)
                call = EmbedCall(plain.normalize)
                option = embed_options(served, call, self.core.sparse_models)
                prompt = call_prompt(served, None, True, False)
                mine = check_texts(plain.texts, s.max_inputs_per_request, s.max_input_chars)
            except ServiceError as exc:
                out[i] = exc
                continue
            checked[i] = (served, call, option)
            texts.setdefault(served, []).append((i, [prompt + t for t in mine] if prompt else mine))
        for served, group in texts.items():
            flat = [text for _, mine in group for text in mine]
            self.core.metrics.tokenized_of(served.name).inc(len(flat))
            started = time.perf_counter()
            encoded = served.tokenizer.encode(flat, True, detailed=False)  # cut; refused per call below
            tokenize_s = time.perf_counter() - started
            at = 0
            for i, mine in group:
                _, call, option = checked[i]
                part, at = encoded[at : at + len(mine)], at + len(mine)
                try:
                    self._check(calls[i], served, option, mine, part)
                except ServiceError as exc:
                    out[i] = exc
                    continue
                out[i] = Prepared(served, call, option, part, calls[i].deadline, tokenize_s)
        return out

    def _check(
        self, plain: PlainEmbed, served: ServedModel, option: TaskOptions, texts: list[str],
        encoded: list[EncodedInput],
    ) -> None:  # fmt: skip
        if not (plain.truncate or self.settings.auto_truncate):
            for i, e in enumerate(encoded):
                if e.truncated:  # as ModelTokenizer.encode refuses it
                    raise InvalidInput(
                        f"inputs[{i}]: {served.tokenizer.count_tokens(texts[i])} tokens is more than the "
                        f"model's max_length {served.tokenizer.max_length} (set truncate to cut it)"
                    )
        check_embed_answer_size(served, [option], encoded, self.settings.max_message_bytes)

    def submit(self, prepared: Prepared, on_done: Callable[[EmbedResult | ServiceError], None]) -> None:
        """On the event loop: admits the call's inputs (or calls `on_done` with the refusal at once) and
        calls `on_done` with its result once every input is computed."""
        served, loop = prepared.served, asyncio.get_running_loop()
        items = [
            WorkItem(
                e.ids, e.type_ids, prepared.option, loop.create_future(), prepared.deadline, model=served
            )
            for e in prepared.encoded
        ]
        try:
            served.encoder.batcher.submit(items)
        except ServiceError as exc:
            on_done(exc)
            return
        self.core.metrics.inputs_of(served.name, Task.EMBED.value).inc(len(items))
        left = [len(items)]  # inputs still computing; 0 once the call is answered

        def one_done(future: asyncio.Future) -> None:
            if not left[0]:
                return
            failed = future.cancelled() or future.exception() is not None
            left[0] = 0 if failed else left[0] - 1
            if failed:
                for item in items:  # the owner skips what is still queued
                    item.future.cancel()
                on_done(ShuttingDown("the call was cancelled") if future.cancelled() else future.exception())
            elif not left[0]:
                results = [item.future.result() for item in items]
                meta = call_meta(served, prepared.encoded, prepared.tokenize_s, results)
                values = [r.value for r in results]
                on_done(embed_result(served, prepared.call, prepared.option, values, meta))

        for item in items:
            item.future.add_done_callback(one_done)
