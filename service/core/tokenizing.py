"""Texts and token ids into the graph's inputs: methods of the inference core (`InferenceCore` inherits them).

Small calls are tokenized on the event loop, others on the CPU pool (`INLINE_TOKENIZE_CHARS`); every text
is checked against max_inputs_per_request and max_input_chars before any is tokenized.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

import numpy as np

from bertserve.service.core.embed_inputs import encode_token_ids
from bertserve.service.core.results import TokenizeResult
from bertserve.service.core.results import call_meta as _meta
from bertserve.service.core.token_slices import encode_sliced
from bertserve.service.core.validation import check_texts
from bertserve.service.engine.pair_truncation import INPUT_PAIRS, PairNames
from bertserve.service.engine.served_model import ServedModel
from bertserve.service.engine.tasks.fill_mask import mask_positions
from bertserve.service.engine.tokenization import EncodedInput
from bertserve.service.errors import InvalidInput

# Calls with at most this many characters in all are tokenized on the event loop (cheaper than the hop to
# the CPU pool, and a bounded hold of the loop: docs/architecture.md); longer calls go to the pool.
INLINE_TOKENIZE_CHARS = 256


class TokenizingCalls:
    """Tokenize, and the tokenizing steps of every call, mixed into `InferenceCore` (this module imports
    nothing of it): they use its `registry`, `settings`, `metrics`, `off_loop` and its slices' pool."""

    async def tokenize(self, model: str, texts: Sequence[str], *, truncate: bool = False) -> TokenizeResult:
        """The model's tokenization of each text (`model` "" = the first model); runs no graph."""
        served = self.registry.resolve(model, None)
        encoded, tokenize_s = await self._tokenize(served, self._check_texts(texts), truncate)
        return TokenizeResult(encoded, _meta(served, encoded, tokenize_s, []))

    def _check_texts(self, texts: Sequence[str]) -> list[str]:
        """The texts as a list, refused (InvalidInput) over max_inputs_per_request or max_input_chars."""
        return check_texts(texts, self.settings.max_inputs_per_request, self.settings.max_input_chars)

    async def _tokenize(
        self,
        model: ServedModel,
        checked: list[str],
        truncate: bool,
        detailed: bool = True,
        left: bool = False,
    ) -> tuple[list[EncodedInput], float]:
        """`checked` (from `_check_texts`) tokenized; `detailed` False: the inputs only feed the graph (no
        token strings or offsets); `left`: a cut input keeps its last tokens. Counted in
        bertserve_tokenized_inputs_total, refused or not."""
        self.metrics.tokenized_of(model.name).inc(len(checked))
        encode = functools.partial(self.encode_texts, model, checked, truncate, detailed, left)
        return await self._timed(encode, sum(len(text) for text in checked))

    def encode_texts(
        self, model: ServedModel, texts: list[str], truncate: bool, detailed: bool = True, left: bool = False
    ) -> list[EncodedInput]:
        """Blocking: `model.tokenizer.encode`, a large call's texts in slices on several threads."""
        pool, threads = self._slices, self.tokenize_threads
        return encode_sliced(model.tokenizer, texts, truncate, detailed, left, pool, threads)

    async def _tokenize_pairs(
        self,
        model: ServedModel,
        firsts: list[str],
        seconds: list[str],
        truncate: bool,
        strategy: str,
        names: PairNames = INPUT_PAIRS,
    ) -> tuple[list[EncodedInput], float]:
        """Checked sentence pairs tokenized for the graph (`ModelTokenizer.encode_pairs`), as `_tokenize`:
        counted in bertserve_tokenized_inputs_total."""
        self.metrics.tokenized_of(model.name).inc(len(firsts))
        encode = functools.partial(
            model.tokenizer.encode_pairs, firsts, seconds, truncate, strategy, False, names
        )
        chars = sum(len(text) for text in firsts) + sum(len(text) for text in seconds)
        return await self._timed(encode, chars)

    async def _from_token_ids(
        self, model: ServedModel, token_ids: Sequence[Sequence[int]], truncate: bool, left: bool
    ) -> tuple[list[EncodedInput], float]:
        """Token ids checked against the graph's vocabulary and max_length (see `embed_inputs`)."""
        args = (token_ids, model.manifest.dimensions.vocab_size, model.manifest.max_length, truncate, left)
        return await self._timed(
            functools.partial(encode_token_ids, *args), sum(len(ids) for ids in token_ids)
        )

    async def _timed(
        self, encode: Callable[[], list[EncodedInput]], chars: int
    ) -> tuple[list[EncodedInput], float]:
        """`encode()` and its seconds: on the event loop up to INLINE_TOKENIZE_CHARS characters (a bounded
        hold), else on the CPU pool."""
        started = time.perf_counter()
        encoded = encode() if chars <= INLINE_TOKENIZE_CHARS else await self.off_loop(encode)
        return encoded, time.perf_counter() - started

    def _masks(self, model: ServedModel, index: int, encoded: EncodedInput) -> np.ndarray:
        spec = model.manifest.tasks.fill_mask
        positions = mask_positions(encoded.ids, spec.mask_token_id)
        if len(positions) == 0:
            cut = " after truncation" if encoded.truncated else ""
            raise InvalidInput(f"inputs[{index}]: no {spec.mask_token} token{cut}")
        if len(positions) > self.settings.max_masks_per_input:
            raise InvalidInput(
                f"inputs[{index}]: {len(positions)} {spec.mask_token} tokens is more than "
                f"max_masks_per_input {self.settings.max_masks_per_input}"
            )
        return positions
