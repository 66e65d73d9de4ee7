"""Attention: a method of the inference core (`InferenceCore` inherits it).

An attention call is admitted by the model's encoder queue owner (`max_queue_attention`, its place taken
before tokenizing) and runs on the same worker thread, alternating with batches.
"""

from __future__ import annotations

from collections.abc import Sequence

from bertserve.service.core.results import AttentionResult
from bertserve.service.core.results import call_meta as _meta
from bertserve.service.engine.attention import check_response_size, select_indices
from bertserve.service.errors import InvalidInput


class AttentionCalls:
    """Attention, mixed into `InferenceCore` (this module imports nothing of it): it uses its `registry`,
    `settings`, `metrics`, `_check_texts` and `_tokenize`."""

    async def attention(
        self,
        model: str,
        text: str,
        *,
        layers: Sequence[int] = (),
        heads: Sequence[int] = (),
        truncate: bool = False,
        deadline: float | None = None,
        reply_bytes: tuple[int, int] | None = None,
    ) -> AttentionResult:
        """For one text, the attention probabilities of the chosen layers and heads (empty: all), in
        request order. Admitted by the model's encoder queue owner (`max_queue_attention`). `reply_bytes`:
        (per probability, per token) in the caller's reply, to refuse one too large before computing it
        (None: protobuf's)."""
        served = self.registry.resolve_attention(model)
        dims = served.manifest.dimensions
        chosen_layers = select_indices(layers, dims.num_hidden_layers, "layers", served.name)
        chosen_heads = select_indices(heads, dims.num_attention_heads, "heads", served.name)
        batcher = served.encoder.batcher
        try:
            checked = self._check_texts([text])
            permit = batcher.reserve_exclusive()  # its place first: a refused call costs no tokenization
            try:
                encoded, tokenize_s = await self._tokenize(served, checked, truncate)
            except BaseException:
                permit.release()
                raise
        except InvalidInput as exc:  # the checks speak of inputs[0]; this call has one `input`
            raise InvalidInput(str(exc).replace("inputs[0]", "input", 1)) from None
        try:
            (e,) = encoded
            maps_count = len(chosen_layers) * len(chosen_heads)
            check_response_size(maps_count, e.length, self.settings.max_message_bytes, *(reply_bytes or ()))
            self.metrics.inputs.labels(served.name, "attention").inc()
            run = served.attention.bind(e.ids, e.type_ids, chosen_layers, chosen_heads, served.name)
        except BaseException:
            permit.release()
            raise
        result = await batcher.submit_exclusive(run, e.length, deadline, permit)
        return AttentionResult(
            tokens=e,
            layers=chosen_layers,
            heads=chosen_heads,
            maps=result.value,
            num_layers=dims.num_hidden_layers,
            num_heads=dims.num_attention_heads,
            meta=_meta(served, encoded, tokenize_s, [result]),
        )
