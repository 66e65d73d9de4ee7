"""Pretraining text: plain text files (one text per line) or WordNet's glosses, tokenized with word ids,
split into training and held-out texts, and cut into length-bucketed batches.

Held-out split of a text file: a hash of the text (`sha256('pretrain-<text>')`), so a line repeated in the
file is on one side only. WordNet (`--wordnet`): the held-out texts are exactly those `bertserve
train-heads` measures its fill-mask head on (the definitions and examples of the held-out noun synsets,
train/heads/wordnet.py's split); training uses the other noun synsets and every verb, adjective and adverb
gloss, less any text equal to a held-out one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from bertserve.train.heads.wordnet import load_noun_synsets, split_gloss, split_of, wordnet_dir

MAX_TOKENS = 64  # as train/heads/features.py: glosses are short; longer texts are truncated
OTHER_WORDNET_FILES = ("data.verb", "data.adj", "data.adv")
CHUNK_BATCHES = 64  # batches drawn from one length-sorted chunk of the shuffled texts


@dataclass(frozen=True)
class Tokenized:
    ids: list[np.ndarray]  # per text, int64 wordpiece ids with [CLS] and [SEP]
    word_ids: list[np.ndarray]  # per text, the word index of each position; -1 for special tokens

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def token_count(self) -> int:
        return int(sum(len(ids) for ids in self.ids))


def tokenize(tokenizer: Tokenizer, texts: Sequence[str], max_tokens: int = MAX_TOKENS) -> Tokenized:
    tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a copy: truncation/padding settings are per object
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_tokens)
    encodings = tokenizer.encode_batch(list(texts))
    ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
    word_ids = [np.asarray([-1 if w is None else w for w in e.word_ids], dtype=np.int64) for e in encodings]
    return Tokenized(ids, word_ids)


def text_split(text: str, held_out_percent: int) -> str:
    bucket = int.from_bytes(hashlib.sha256(f"pretrain-{text}".encode()).digest()[:4], "big") % 100
    return "test" if bucket < held_out_percent else "train"


def read_text_files(paths: Sequence[Path], held_out_percent: int) -> tuple[list[str], list[str]]:
    """Non-empty lines of the files -> (training texts, held-out texts)."""
    train, test = [], []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                text = line.strip()
                if text:
                    (test if text_split(text, held_out_percent) == "test" else train).append(text)
    return train, test


def gloss_texts(gloss: str) -> list[str]:
    definition, examples = split_gloss(gloss)
    return [t for t in (definition, *examples) if t]


def read_other_glosses(directory: Path) -> list[str]:
    """Definitions and examples of every verb, adjective and adverb synset."""
    texts = []
    for name in OTHER_WORDNET_FILES:
        with open(Path(directory) / name, encoding="utf-8") as f:
            for line in f:
                if not line.startswith(" ") and "|" in line:
                    texts.extend(gloss_texts(line.partition("|")[2]))
    return texts


def wordnet_noun_split(held_out_percent: int = 10) -> tuple[list[str], list[str]]:
    """(training noun texts, held-out noun texts) in export/heads' order: definition, then examples."""
    synsets = load_noun_synsets()
    train = [
        t
        for s in synsets
        if split_of(s.offset, held_out_percent) == "train"
        for t in (s.definition, *s.examples)
    ]
    test = [
        t
        for s in synsets
        if split_of(s.offset, held_out_percent) == "test"
        for t in (s.definition, *s.examples)
    ]
    return train, test


def read_wordnet(held_out_percent: int = 10) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts): see the module docstring."""
    noun_train, test = wordnet_noun_split(held_out_percent)
    held_out = {t.lower() for t in test}
    train = [t for t in noun_train + read_other_glosses(wordnet_dir()) if t.lower() not in held_out]
    return train, test


def batches_of_epoch(lengths: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The epoch's batches (text indices): the texts shuffled, cut into chunks of CHUNK_BATCHES batches,
    each chunk sorted by length (little padding), its batches shuffled. Depends on (seed, epoch) only; the
    number of batches is the same every epoch."""
    rng = np.random.default_rng([seed, 0, epoch])
    order = rng.permutation(len(lengths))
    batches = []
    chunk = CHUNK_BATCHES * batch_size
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches.extend(part[i : i + batch_size] for i in range(0, len(part), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def batches_per_epoch(text_count: int, batch_size: int) -> int:
    chunk = CHUNK_BATCHES * batch_size
    full, rest = divmod(text_count, chunk)
    return full * CHUNK_BATCHES + -(-rest // batch_size)
