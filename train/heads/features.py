"""Features from the frozen encoder: [CLS] hidden states of whole texts, hidden states at [MASK] positions.

The encoder is the scratch BERT (`export/model.py`) in eval mode; texts are batched by length (sorted, so
batches carry little padding) and the results are put back in the input order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from tokenizers import Tokenizer

from bertserve.export.model import BertModel

MAX_TOKENS = 64  # glosses are short (16 wordpieces on average); longer ones are truncated
BATCH_TOKENS = 4096  # padded tokens per encoder batch


def tokenize(tokenizer: Tokenizer, texts: Sequence[str], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    """Texts -> wordpiece ids with [CLS] and [SEP], truncated, unpadded."""
    tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a copy: padding/truncation settings are per object
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_tokens)
    return [e.ids for e in tokenizer.encode_batch(list(texts))]


def length_batches(lengths: Sequence[int], batch_tokens: int = BATCH_TOKENS) -> Iterator[np.ndarray]:
    """Indices grouped into batches of similar length, each at most `batch_tokens` padded tokens."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and (stop - start + 1) * lengths[order[stop]] <= batch_tokens:
            stop += 1
        yield order[start:stop]
        start = stop


def pad(id_lists: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(ids) for ids in id_lists)
    input_ids = torch.full((len(id_lists), longest), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(id_lists), longest), dtype=torch.long)  # (B, T)
    for row, ids in enumerate(id_lists):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask


@torch.inference_mode()
def encode_batches(
    encoder: BertModel, id_lists: Sequence[Sequence[int]]
) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """Yields (indices, last_hidden_state (B, T, C), attention_mask (B, T)) batch by batch."""
    encoder.eval()
    for indices in length_batches([len(ids) for ids in id_lists]):
        input_ids, attention_mask = pad([id_lists[i] for i in indices])
        hidden = encoder(input_ids, attention_mask).last_hidden_state  # (B, T, C)
        yield indices, hidden, attention_mask


def cls_features(encoder: BertModel, id_lists: Sequence[Sequence[int]]) -> np.ndarray:
    """The last layer's [CLS] hidden state of every text: (N, C), the pooler's input."""
    out = np.zeros((len(id_lists), encoder.config.hidden_size), dtype=np.float32)
    for indices, hidden, _ in encode_batches(encoder, id_lists):
        out[indices] = hidden[:, 0].numpy()
    return out


def masked_features(
    encoder: BertModel, masked_id_lists: Sequence[Sequence[int]], mask_token_id: int
) -> np.ndarray:
    """The last layer's hidden state at every [MASK], texts in order and positions left to right: (M, C)."""
    counts = np.array([sum(t == mask_token_id for t in ids) for ids in masked_id_lists])
    first_row = np.concatenate([[0], np.cumsum(counts)])
    out = np.zeros((int(counts.sum()), encoder.config.hidden_size), dtype=np.float32)
    for indices, hidden, _ in encode_batches(encoder, masked_id_lists):
        input_ids, _ = pad([masked_id_lists[i] for i in indices])
        batch_rows, positions = (input_ids == mask_token_id).nonzero(as_tuple=True)
        states = hidden[batch_rows, positions].numpy()  # (masks in batch, C), row-major: text, then position
        rows = np.concatenate([np.arange(first_row[i], first_row[i + 1]) for i in indices])
        out[rows] = states
    return out
