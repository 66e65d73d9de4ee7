"""Long texts cut into overlapping windows of tokens, each wrapped by the tokenizer's post-processor
(chunked embedding calls, service/core/chunking.py).

A text is tokenized whole without special tokens (its size is bounded by max_input_chars), in groups of at
most CHUNK_CHARS characters; its windows hold `width` tokens each and start every `width - overlap` tokens
(`tokenizers`' Encoding.truncate with a stride), the last one reaching the text's end. The windows of a
call are counted from the token counts before any is built, and a call over `max_windows` is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Encoding, Tokenizer

from bertserve.service.engine.token_counts import chunks
from bertserve.service.errors import InvalidInput


def window_count(tokens: int, width: int, overlap: int) -> int:
    """Windows of `width` tokens, `overlap` shared by neighbours, that cover `tokens` (at least one)."""
    if tokens <= width:
        return 1
    stride = width - overlap
    return 1 + -(-(tokens - width) // stride)


def token_windows(
    tokenizer: Tokenizer, texts: Sequence[str], width: int, overlap: int, max_windows: int
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per text, its windows as the graph reads them, (ids, type ids) int64 (special tokens added by the post-processor).
    `tokenizer` must neither truncate nor pad. InvalidInput when the call needs more than `max_windows`,
    raised as soon as the count passes it (the texts after are not tokenized)."""
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    out: list[list[tuple[np.ndarray, np.ndarray]]] = []
    total = 0
    for chunk in chunks({i: len(texts[i]) for i in range(len(texts))}):
        encodings = encode_batch([texts[i] for i in chunk], add_special_tokens=False)
        total += sum(window_count(len(e.ids), width, overlap) for e in encodings)
        if total > max_windows:
            raise InvalidInput(
                f"chunking: the inputs need more than {max_windows} windows, the limit "
                f"max_inputs_per_request; send fewer or shorter inputs, or longer windows with less overlap"
            )
        for encoding in encodings:
            encoding.truncate(width, stride=overlap)  # the first window, the others as `overflowing`
            wrapped = tokenizer.post_process(encoding)
            windows = [wrapped, *wrapped.overflowing]
            out.append([_window(w) for w in windows])
        del encodings
    return out


def _window(encoding: Encoding) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(encoding.ids, dtype=np.int64), np.asarray(encoding.type_ids, dtype=np.int64)
