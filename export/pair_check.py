"""A classifier's graphs against PyTorch on sentence pairs, before anything is written.

The per-graph checks compare each graph with the module it was traced from; this one runs the chain the
server runs (encoder graph, then classifier_head on its pooler output or [CLS] row) on pair-shaped batches,
`[CLS] a [SEP] b [SEP]` with segment ids 0 then 1, and compares the logits with the checkpoint's own
classifier module. So a graph that drops or misreads the segment ids fails the export. The batches are
random ids in that shape (rows padded to random lengths) and the tokenizer's own encodings of text pairs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer
from torch import nn

from bertserve.export.errors import VerificationError
from bertserve.export.sentences import SENTENCES
from bertserve.export.verify import session
from bertserve.repository import CLS_HIDDEN_STATE, LAST_HIDDEN_STATE, POOLER_OUTPUT, TOKEN_INPUTS

PAIR_BATCHES = ((1, 1.0), (3, 0.25))  # (rows, longest row as a share of max_length)
TOKENIZED_PAIRS = 8  # built-in sentences, each paired with another


def random_pairs(
    rng: np.random.Generator, rows: int, length: int, vocab: int, cls_id: int, sep_id: int, pad_id: int
) -> dict[str, np.ndarray]:
    """Rows `[CLS] a [SEP] b [SEP]` of random ids; row 0 is `length` long, the others shorter (padded)."""
    length = max(length, 5)  # room for two one-token texts
    feed = {name: np.zeros((rows, length), dtype=np.int64) for name in TOKEN_INPUTS}
    feed["input_ids"].fill(pad_id)
    for row in range(rows):
        n = length if row == 0 else int(rng.integers(5, length + 1))
        first = int(rng.integers(1, n - 3))  # tokens of text a; text b takes the rest
        second = n - 3 - first
        ids = [cls_id, *rng.integers(0, vocab, first), sep_id, *rng.integers(0, vocab, second), sep_id]
        feed["input_ids"][row, :n] = ids
        feed["attention_mask"][row, :n] = 1
        feed["token_type_ids"][row, first + 2 : n] = 1
    return feed


def tokenized_pairs(tokenizer: Tokenizer, pad_id: int) -> dict[str, np.ndarray]:
    """The built-in sentences paired with each other, encoded by the repository's tokenizer."""
    pairs = list(zip(SENTENCES[:TOKENIZED_PAIRS], SENTENCES[::-1][:TOKENIZED_PAIRS], strict=True))
    encodings = tokenizer.encode_batch(pairs)
    length = max(len(e.ids) for e in encodings)
    feed = {name: np.zeros((len(pairs), length), dtype=np.int64) for name in TOKEN_INPUTS}
    feed["input_ids"].fill(pad_id)
    for row, e in enumerate(encodings):
        n = len(e.ids)
        feed["input_ids"][row, :n] = e.ids
        feed["attention_mask"][row, :n] = 1
        feed["token_type_ids"][row, :n] = e.type_ids
    return feed


def pair_feeds(
    tokenizer: Tokenizer, max_length: int, vocab: int, cls_id: int, sep_id: int, pad_id: int, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    feeds = [
        random_pairs(rng, rows, round(share * max_length), vocab, cls_id, sep_id, pad_id)
        for rows, share in PAIR_BATCHES
    ]
    return [*feeds, tokenized_pairs(tokenizer, pad_id)]


def chained_logits(
    encoder: ort.InferenceSession, head: ort.InferenceSession, head_input: str, feed: dict[str, np.ndarray]
) -> np.ndarray:
    """What the server computes: the encoder graph, then the head on the output it takes."""
    if head_input == CLS_HIDDEN_STATE:
        hidden = encoder.run([LAST_HIDDEN_STATE], feed)[0]
        head_feed = {CLS_HIDDEN_STATE: np.ascontiguousarray(hidden[:, 0])}
    else:
        head_feed = {POOLER_OUTPUT: encoder.run([POOLER_OUTPUT], feed)[0]}
    return head.run(None, head_feed)[0]


def check_classifier_pairs(
    encoder: Path,
    head: Path,
    head_input: str,
    classifier: nn.Module,
    feeds: list[dict[str, np.ndarray]],
    tolerance: float,
) -> float:
    """Max |chained graphs - classifier module| over the pair batches; VerificationError over tolerance."""
    worst = 0.0
    encoder_session, head_session = session(encoder), session(head)
    for feed in feeds:
        got = chained_logits(encoder_session, head_session, head_input, feed)
        with torch.no_grad():
            expected = classifier(*(torch.from_numpy(feed[name]) for name in TOKEN_INPUTS)).numpy()
        worst = max(worst, float(np.abs(got.astype(np.float64) - expected).max()))
    if not worst <= tolerance:  # also catches NaN
        shapes = [list(feed["input_ids"].shape) for feed in feeds]
        raise VerificationError(
            f"{encoder.name} + {head.name}: logits on sentence pairs (segment ids 0 then 1) differ from "
            f"PyTorch by {worst:.3g} (> tolerance {tolerance:g}) over shapes {shapes}"
        )
    return worst
