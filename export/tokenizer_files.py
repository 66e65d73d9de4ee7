"""The repository's tokenizer.json: taken from the checkpoint (or built from its vocab.txt), with
truncation set to the manifest's max_length and padding off (the server pads each batch itself)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from bertserve.export.errors import CheckpointError

TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class SpecialTokens:
    do_lower_case: bool
    cls_token: str
    sep_token: str
    pad_token: str
    pad_token_id: int
    mask_token: str
    mask_token_id: int | None  # None when the vocabulary has no mask token


def json_or_empty(path: Path) -> dict:
    """A JSON object file's contents; {} when the file is absent or holds no object."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _token_text(value, default: str) -> str:
    if isinstance(value, dict):  # {"content": "[CLS]", ...} in some tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) and value else default


def load_tokenizer(directory: Path) -> Tokenizer:
    directory = Path(directory)
    lower = json_or_empty(directory / "tokenizer_config.json").get("do_lower_case", True)
    try:
        if (directory / TOKENIZER_FILE).is_file():
            return Tokenizer.from_file(str(directory / TOKENIZER_FILE))
        if (directory / "vocab.txt").is_file():
            from tokenizers.implementations import BertWordPieceTokenizer

            built = BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=bool(lower))
            return Tokenizer.from_str(built.to_str())
    except Exception as e:  # the tokenizers library raises plain Exceptions on malformed files
        raise CheckpointError(f"{directory}: unreadable tokenizer ({e})") from None
    raise CheckpointError(f"{directory}: no tokenizer.json or vocab.txt")


def special_tokens(directory: Path, tokenizer: Tokenizer) -> SpecialTokens:
    directory = Path(directory)
    config = {
        **json_or_empty(directory / "tokenizer_config.json"),
        **json_or_empty(directory / "special_tokens_map.json"),
    }
    names = {
        key: _token_text(config.get(key), default)
        for key, default in [
            ("cls_token", "[CLS]"),
            ("sep_token", "[SEP]"),
            ("pad_token", "[PAD]"),
            ("mask_token", "[MASK]"),
        ]
    }
    for key in ("cls_token", "sep_token", "pad_token"):
        if tokenizer.token_to_id(names[key]) is None:
            raise CheckpointError(f"{directory}: the tokenizer has no {key} {names[key]!r}")
    normalizer = json.loads(tokenizer.to_str()).get("normalizer") or {}
    lower = normalizer.get("lowercase", config.get("do_lower_case", True))
    return SpecialTokens(
        do_lower_case=bool(lower),
        pad_token_id=tokenizer.token_to_id(names["pad_token"]),
        mask_token_id=tokenizer.token_to_id(names["mask_token"]),
        **names,
    )


def pair_template(tokenizer: Tokenizer) -> str | None:
    """How the tokenizer's post-processor joins two texts, as "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1" (each piece
    a special token or a sequence, with its segment id); None when it has no pair template."""
    return _template_of(json.loads(tokenizer.to_str()).get("post_processor"))


def _template_of(processor) -> str | None:
    if not isinstance(processor, dict):
        return None
    kind = processor.get("type")
    if kind == "TemplateProcessing":
        pieces = []
        for piece in processor.get("pair") or []:
            if "SpecialToken" in piece:
                pieces.append("{id}:{type_id}".format(**piece["SpecialToken"]))
            elif "Sequence" in piece:
                pieces.append("${id}:{type_id}".format(**piece["Sequence"]))
        return " ".join(pieces) or None
    if kind == "BertProcessing":  # [CLS] A [SEP] segment 0, B [SEP] segment 1
        cls, sep = processor["cls"][0], processor["sep"][0]
        return f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1"
    if kind == "Sequence":  # e.g. a byte-level step then the template: the first that joins pairs
        for step in processor.get("processors") or []:
            if (template := _template_of(step)) is not None:
                return template
    return None


def for_repository(tokenizer: Tokenizer, max_length: int) -> Tokenizer:
    """A copy that truncates at max_length and does not pad."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.enable_truncation(max_length)
    copy.no_padding()
    return copy


def encode(tokenizer: Tokenizer, texts: list[str], pad_id: int) -> dict[str, np.ndarray]:
    """Token arrays for texts, padded to the longest (as the server batches them)."""
    encodings = tokenizer.encode_batch(texts)
    T = max(len(e.ids) for e in encodings)
    batch = {
        name: np.zeros((len(texts), T), dtype=np.int64)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    }
    batch["input_ids"].fill(pad_id)
    for i, e in enumerate(encodings):
        n = len(e.ids)
        batch["input_ids"][i, :n] = e.ids
        batch["attention_mask"][i, :n] = 1
        batch["token_type_ids"][i, :n] = e.type_ids
    return batch
