"""BERT's masked-language-model corruption, applied to tokenized texts.

A fraction `rate` (15 %) of the units is chosen, each unit independently; a unit is one wordpiece, or with
`whole_word` every wordpiece of one word (so a word is never half chosen). Of the chosen units, 80 % become
[MASK], 10 % a random token (uniform over the vocabulary less the special tokens, one draw per wordpiece) and
10 % stay as they are; the fate is drawn per unit, so a whole word is masked, replaced or kept together.
Special tokens ([CLS], [SEP], padding: word id -1) are never chosen. The loss is taken at the chosen
positions only (label = the original token, IGNORE elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IGNORE = -100  # label of a position that is not predicted (torch's cross_entropy ignore_index default)
KEPT, MASKED, RANDOM = 0, 1, 2  # the fate of a chosen unit


@dataclass(frozen=True)
class MaskingScheme:
    rate: float = 0.15
    mask_fraction: float = 0.8
    random_fraction: float = 0.1  # the rest of the chosen units (0.1) keep their token
    whole_word: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.rate < 1:
            raise ValueError(f"masking rate must be in (0, 1), not {self.rate}")
        if (
            self.mask_fraction < 0
            or self.random_fraction < 0
            or self.mask_fraction + self.random_fraction > 1
        ):
            raise ValueError("mask_fraction and random_fraction must be >= 0 and sum to at most 1")


def units_of(word_ids: np.ndarray, whole_word: bool) -> np.ndarray:
    """The masking unit of every position: its word id (whole words) or its position; -1 for special tokens."""
    if whole_word:
        return word_ids
    return np.where(word_ids >= 0, np.arange(len(word_ids)), -1)


def mask_one(
    ids: np.ndarray,
    word_ids: np.ndarray,
    scheme: MaskingScheme,
    rng: np.random.Generator,
    mask_token_id: int,
    random_token_ids: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One text -> (corrupted ids, labels, fate per position: -1 not chosen, else KEPT/MASKED/RANDOM)."""
    units = units_of(word_ids, scheme.whole_word)
    candidates = np.unique(units[units >= 0])
    chosen = candidates[rng.random(len(candidates)) < scheme.rate]
    draw = rng.random(len(chosen))
    fates = np.where(
        draw < scheme.mask_fraction,
        MASKED,
        np.where(draw < scheme.mask_fraction + scheme.random_fraction, RANDOM, KEPT),
    )
    fate_of_unit = np.full(int(units.max(initial=-1)) + 2, -1)  # index -1 (special) stays -1
    fate_of_unit[chosen] = fates
    fate = fate_of_unit[units]  # (T,)
    corrupted = ids.copy()
    corrupted[fate == MASKED] = mask_token_id
    replaced = fate == RANDOM
    corrupted[replaced] = random_token_ids[rng.integers(len(random_token_ids), size=int(replaced.sum()))]
    labels = np.where(fate >= 0, ids, IGNORE)
    return corrupted, labels, fate


def mask_texts(
    id_arrays: Sequence[np.ndarray],
    word_id_arrays: Sequence[np.ndarray],
    scheme: MaskingScheme,
    rng: np.random.Generator,
    mask_token_id: int,
    random_token_ids: np.ndarray,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Texts -> (corrupted id arrays, label arrays), in order."""
    inputs, labels = [], []
    for ids, word_ids in zip(id_arrays, word_id_arrays, strict=True):
        corrupted, label, _ = mask_one(ids, word_ids, scheme, rng, mask_token_id, random_token_ids)
        inputs.append(corrupted)
        labels.append(label)
    return inputs, labels
