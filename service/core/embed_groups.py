"""Plain embedding calls taken in groups (the native gRPC transport's calls: service/grpc/native/), so the
core's Python work is per group rather than per call. As `InferenceCore.embed` does, each call is checked,
then takes room in its encoder's queue for all its inputs or is refused (`admit`, on the event loop) BEFORE
its texts are tokenized; the group's texts are then tokenized in one pass per model (`prepare`), and each
call's inputs are queued in its room (`submit`) and batched with every other front's inputs.

A plain call has texts, a model, normalize and truncate; anything else goes through `embed`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bertserve.service.core.embed_options import check_embed_answer_size, embed_options, embed_result
from bertserve.service.core.prompts import call_prompt
from bertserve.service.core.results import EmbedResult, call_meta
from bertserve.service.core.task_calls import EmbedCall
from bertserve.service.core.validation import check_texts
from bertserve.service.engine.batcher import Permit
from bertserve.service.engine.served_model import ServedModel
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.tokenization import EncodedInput
from bertserve.service.engine.unary_calls import CallInputs
from bertserve.service.errors import ServiceError, ShuttingDown

Cancel = Callable[[], None]


@dataclass(frozen=True)
class PlainEmbed:
    model: str  # "" = the default embedding model
    texts: list[str]
    normalize: bool | None  # None: the model's default
    truncate: bool
    deadline: float | None  # time.monotonic() seconds


@dataclass
class Admitted:
    """A checked call holding room for its inputs: tokenized by `EmbedGroups.prepare`, queued by `submit`;
    `permit.release()` gives the room back when it is never queued."""

    plain: PlainEmbed
    served: ServedModel
    call: EmbedCall
    option: TaskOptions
    texts: list[str]  # with the model's prompt
    permit: Permit
    encoded: list[EncodedInput] | None = None
    tokenize_s: float = 0.0


class EmbedGroups:
    def __init__(self, core):
        """`core`: the InferenceCore whose models, settings, metrics and queues the calls use."""
        self.core = core
        self.settings = core.settings

    def admit(self, plain: PlainEmbed) -> Admitted:
        """On the event loop: the call checked (model, options, its texts' count and lengths) and room taken
        for its inputs, or the ServiceError that refuses it."""
        s = self.settings
        served = self.core.registry.resolve(plain.model, Task.EMBED)
        call = EmbedCall(plain.normalize)
        option = embed_options(served, call, self.core.sparse_models)
        prompt = call_prompt(served, None, True, False)
        texts = check_texts(plain.texts, s.max_inputs_per_request, s.max_input_chars)
        permit = served.encoder.batcher.reserve(len(texts), False, plain.deadline)
        texts = [prompt + t for t in texts] if prompt else texts
        return Admitted(plain, served, call, option, texts, permit)

    def prepare(self, calls: list[Admitted]) -> list[Admitted | ServiceError]:
        """Blocking (tokenization: on the event loop only when short): per call, itself tokenized or why it
        is refused (the caller gives its room back, on the event loop)."""
        out: list[Admitted | ServiceError] = list(calls)
        by_model: dict[ServedModel, list[int]] = {}
        for i, admitted in enumerate(calls):
            by_model.setdefault(admitted.served, []).append(i)
        for served, group in by_model.items():
            flat = [text for i in group for text in calls[i].texts]
            self.core.metrics.tokenized_of(served.name).inc(len(flat))
            started = time.perf_counter()
            # cut at max_length; a call that did not ask to truncate is refused below
            encoded = self.core.encode_texts(served, flat, True, detailed=False)
            tokenize_s = time.perf_counter() - started
            at = 0
            for i in group:
                admitted = calls[i]
                admitted.encoded, at = encoded[at : at + len(admitted.texts)], at + len(admitted.texts)
                admitted.tokenize_s = tokenize_s
                try:
                    self._check(admitted)
                except ServiceError as exc:
                    out[i] = exc
        return out

    def _check(self, admitted: Admitted) -> None:
        served, encoded = admitted.served, admitted.encoded
        if not (admitted.plain.truncate or self.settings.auto_truncate):
            served.tokenizer.refuse_cut(admitted.texts, dict(enumerate(encoded)))  # as `encode` refuses it
        check_embed_answer_size(served, [admitted.option], encoded, self.settings.max_message_bytes)

    def submit(
        self, prepared: Admitted, on_done: Callable[[EmbedResult | BaseException], None]
    ) -> Cancel | None:
        """On the event loop: queues the call's inputs in its room (or calls `on_done` with the refusal at
        once: its deadline is too near, and returns None) and calls `on_done` with its result once every
        input is computed. Returns the call's `cancel`: it drops the call's inputs still queued and answers
        the call as cancelled."""
        served = prepared.served
        encoded = prepared.encoded

        def end(results: list | None, error: BaseException | None) -> None:
            if results is None:
                on_done(error or ShuttingDown("the call was cancelled"))
                return
            try:
                meta = call_meta(served, encoded, prepared.tokenize_s, results)
                values = [r.value for r in results]
                result = embed_result(served, prepared.call, prepared.option, values, meta)
            except Exception as exc:  # answered all the same
                result = exc
            on_done(result)

        ids, type_ids = [e.ids for e in encoded], [e.type_ids for e in encoded]
        inputs = CallInputs(served, ids, type_ids, [prepared.option], prepared.plain.deadline)
        try:
            call = served.encoder.batcher.submit_call(inputs, end, prepared.permit)
        except ServiceError as exc:
            on_done(exc)
            return None
        finally:
            prepared.permit.release()  # room not used (refused); after a submit it was handed over
        self.core.metrics.inputs_of(served.name, Task.EMBED.value).inc(len(encoded))
        return call.cancel
