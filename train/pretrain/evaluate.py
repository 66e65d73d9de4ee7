"""Held-out masked-token accuracy, measured as `bertserve train-heads` measures its fill-mask head.

The held-out texts are masked by train/heads/mlm.py's `mask_tokens` (15 % of the wordpieces of each text,
at least one, every one replaced by [MASK]: what the server's fill-mask sees), the last hidden state at each
[MASK] is computed by train/heads/features.py's `masked_features`, and the MLM head's top-k is compared with
the original token (`mlm.topk_accuracy`). For WordNet the masks are the very masks of heads.json's figures:
the same generator (seed 0) first masks the training noun texts, then the held-out ones.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from bertserve.export.model import BertForMaskedLM
from bertserve.train.heads import features, mlm
from bertserve.train.pretrain.corpus import wordnet_noun_split

HEADS_MASK_SEED = 0  # train/heads/training.py's HeadsPlan.mask_seed


def masked_held_out(
    tokenizer: Tokenizer, texts: list[str], mask_token_id: int, seed: int = 0
) -> tuple[list[list[int]], np.ndarray]:
    return mlm.mask_tokens(features.tokenize(tokenizer, texts), mask_token_id, np.random.default_rng(seed))


def wordnet_held_out(tokenizer: Tokenizer, mask_token_id: int) -> tuple[list[list[int]], np.ndarray]:
    """The held-out masks of train/heads (20,016 masks on 9,309 texts for MiniLM's tokenizer)."""
    train, test = wordnet_noun_split()
    rng = np.random.default_rng(HEADS_MASK_SEED)
    mlm.mask_tokens(features.tokenize(tokenizer, train), mask_token_id, rng)  # advances rng as heads does
    return mlm.mask_tokens(features.tokenize(tokenizer, test), mask_token_id, rng)


def topk(model: BertForMaskedLM, masked: list[list[int]], targets: np.ndarray, mask_token_id: int) -> dict:
    model.eval()
    states = features.masked_features(model.bert, masked, mask_token_id)  # (M, C)
    top = mlm.topk_accuracy(model.cls.predictions, states, targets)
    return {"texts": len(masked), "masks": int(len(targets)), "top1": top[1], "top5": top[5]}
