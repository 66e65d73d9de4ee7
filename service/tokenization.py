"""Tokenization with the Rust `tokenizers` library, sized by the manifest's max_length.

`encode` is blocking and meant to run in a worker thread (the library releases the GIL and encodes
a batch in parallel). Inputs longer than max_length are cut when the request says `truncate`, and
refused with the limit named otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from bertserve.manifest import TokenizerSpec
from bertserve.service.errors import InvalidInput, StartupError


@dataclass(frozen=True)
class EncodedInput:
    ids: np.ndarray  # (T,) int64, special tokens included
    type_ids: np.ndarray  # (T,) int64
    truncated: bool
    tokens: list[str]
    offsets: list[tuple[int, int]]  # character offsets into the text
    special: list[bool]

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])


class ModelTokenizer:
    def __init__(self, path: Path, spec: TokenizerSpec, max_length: int):
        try:
            self._whole = Tokenizer.from_file(str(path))
            self._cutting = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises plain Exception for unreadable files
            raise StartupError(f"{path}: cannot read the tokenizer: {exc}") from None
        self._whole.no_truncation()
        self._whole.no_padding()
        self._cutting.no_padding()
        self._cutting.enable_truncation(max_length)
        self.spec = spec
        self.max_length = max_length
        self.vocab_size = self._whole.get_vocab_size(with_added_tokens=True)
        for token, expected in ((spec.pad_token, spec.pad_token_id), (spec.mask_token, spec.mask_token_id)):
            actual = self._whole.token_to_id(token)
            if actual is not None and actual != expected:
                raise StartupError(f"{path}: token {token} has id {actual}, the manifest says {expected}")

    def encode(self, texts: list[str], truncate: bool) -> list[EncodedInput]:
        """Blocking; run it off the event loop."""
        encodings = self._whole.encode_batch(texts)
        too_long = [i for i, e in enumerate(encodings) if len(e.ids) > self.max_length]
        if too_long and not truncate:
            i = too_long[0]
            raise InvalidInput(
                f"inputs[{i}]: {len(encodings[i].ids)} tokens is more than the model's max_length "
                f"{self.max_length} (set truncate to cut it)"
            )
        if too_long:
            for i, cut in zip(
                too_long, self._cutting.encode_batch([texts[i] for i in too_long]), strict=True
            ):
                encodings[i] = cut
        cut_set = set(too_long)
        return [
            EncodedInput(
                ids=np.asarray(e.ids, dtype=np.int64),
                type_ids=np.asarray(e.type_ids, dtype=np.int64),
                truncated=i in cut_set,
                tokens=e.tokens,
                offsets=e.offsets,
                special=[bool(s) for s in e.special_tokens_mask],
            )
            for i, e in enumerate(encodings)
        ]

    def token_to_id(self, token: str) -> int | None:
        return self._whole.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        return self._whole.id_to_token(token_id) or ""

    def decode(self, ids: list[list[int]], skip_ids: set[int]) -> list[str]:
        """Decodes each id list, leaving out `skip_ids` (e.g. [CLS], [SEP], [PAD]) but keeping other specials."""
        kept = [[t for t in seq if t not in skip_ids] for seq in ids]
        return self._whole.decode_batch(kept, skip_special_tokens=False)
