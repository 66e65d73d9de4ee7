"""The scratch BERT (export/model.py, loaded by export/checkpoint.py) against transformers' BERT."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertserve.export.checkpoint import load_checkpoint
from bertserve.export.default_model import default_checkpoint_dir
from bertserve.export.embedding_defaults import read_embedding_defaults
from bertserve.export.model import mean_pool
from tests.helpers.checkpoints import KINDS, load_reference, make_checkpoint

TOLERANCE = 1e-5


def padded_batch(vocab_size: int, type_vocab_size: int = 2, lengths=(11, 4, 1, 9), seed: int = 0):
    """Random ids with rows of different lengths (padding on the right) and random segment ids."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(0, vocab_size, (len(lengths), T), generator=g) * mask
    types = torch.randint(0, type_vocab_size, (len(lengths), T), generator=g) * mask
    return ids, mask, types


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


def at_real_tokens(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Outputs at padding positions are unspecified (nothing reads them): (B, T, ...) -> (real, ...)."""
    return x[mask.bool()]


def compare(directory, lengths=(11, 4, 1, 9)) -> dict[str, float]:
    """Max abs differences per output between the scratch module and transformers on a padded batch."""
    ours = load_checkpoint(directory)
    ref = load_reference(directory)
    ids, mask, types = padded_batch(ours.config.vocab_size, ours.config.type_vocab_size, lengths)
    diffs = {}
    with torch.no_grad():
        if ours.architecture == "BertModel":
            theirs = ref(input_ids=ids, attention_mask=mask, token_type_ids=types, output_attentions=True)
            mine = ours.model(ids, mask, types, output_attentions=True)
            diffs["last_hidden_state"] = max_diff(
                at_real_tokens(mine.last_hidden_state, mask), at_real_tokens(theirs.last_hidden_state, mask)
            )
            diffs["pooler_output"] = max_diff(mine.pooler_output, theirs.pooler_output)
            # attention rows of padding queries are unspecified; compare the rows of real tokens
            real = mask.bool()[None, :, None, :, None]  # broadcast to (L, B, H, T, T)
            a, b = torch.stack(mine.attentions), torch.stack(theirs.attentions)
            diffs["attentions"] = float(((a - b).abs() * real).max())
        else:
            theirs = ref(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
            mine = ours.model(ids, mask, types)
            if ours.architecture == "BertForMaskedLM":  # (B, T, V): real tokens only
                mine, theirs = at_real_tokens(mine, mask), at_real_tokens(theirs, mask)
            diffs["logits"] = max_diff(mine, theirs)
    return diffs


@pytest.mark.parametrize("kind", KINDS)
def test_scratch_matches_transformers_tiny(make_tiny_checkpoint, kind):
    diffs = compare(make_tiny_checkpoint(kind))
    assert diffs and all(d <= TOLERANCE for d in diffs.values()), diffs


@pytest.mark.parametrize(
    ("kind", "overrides"),
    [
        (
            "BertModel",
            dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=3, hidden_act="gelu_new"),
        ),
        (
            "BertForMaskedLM",
            dict(hidden_size=32, num_attention_heads=2, intermediate_size=37, hidden_act="relu"),
        ),
        ("BertForSequenceClassification", dict(hidden_size=40, num_attention_heads=5, type_vocab_size=3)),
    ],
)
def test_scratch_matches_transformers_random_configs(tmp_path, kind, overrides):
    directory = make_checkpoint(tmp_path / "ckpt", kind, seed=7, num_labels=5, tokenizer=False, **overrides)
    diffs = compare(directory, lengths=(17, 3, 12))
    assert all(d <= TOLERANCE for d in diffs.values()), diffs


def test_legacy_bin_checkpoint_loads_with_tied_decoder(tmp_path):
    """pytorch_model.bin with the tied decoder spelled out and the old position_ids buffer."""
    directory = make_checkpoint(tmp_path / "ckpt", "BertForMaskedLM", safetensors=False, tokenizer=False)
    ours = load_checkpoint(directory)
    assert ours.weights_file.name == "pytorch_model.bin"
    assert "bert.embeddings.position_ids" in ours.dropped_keys
    decoder = ours.model.cls.predictions.decoder.weight
    assert decoder.data_ptr() == ours.model.bert.embeddings.word_embeddings.weight.data_ptr()
    assert compare(directory)["logits"] <= TOLERANCE


def test_bert_prefixed_keys_load_as_base_model(tmp_path):
    """A BertModel config whose weights carry the `bert.` prefix (saved from a head model)."""
    import json

    directory = make_checkpoint(tmp_path / "ckpt", "BertForSequenceClassification", tokenizer=False)
    head_model = load_checkpoint(directory)
    config = json.loads((directory / "config.json").read_text())
    from safetensors.torch import load_file, save_file

    weights = {k: v for k, v in load_file(directory / "model.safetensors").items() if k.startswith("bert.")}
    config["architectures"] = ["BertModel"]
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, directory / "model.safetensors")
    base = load_checkpoint(directory)
    assert base.architecture == "BertModel" and base.has_pooler
    ids, mask, types = padded_batch(base.config.vocab_size)
    with torch.no_grad():
        expected = head_model.model.bert(ids, mask, types).last_hidden_state
        assert max_diff(base.model(ids, mask, types).last_hidden_state, expected) == 0.0


@pytest.fixture(scope="module")
def minilm():
    directory = default_checkpoint_dir()
    return directory, load_checkpoint(directory), load_reference(directory)


SENTENCES = [
    "A man is playing a guitar.",
    "The quick brown fox jumps over the lazy dog, again and again, until the dog finally wakes up.",
    "Hi",
]


def _tokenize(directory, texts):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    encodings = tokenizer.encode_batch(texts)
    T = max(len(e.ids) for e in encodings)
    ids = torch.zeros(len(texts), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = 1
    return ids, mask, torch.zeros_like(ids)


def test_minilm_matches_transformers(minilm):
    directory, ours, ref = minilm
    ids, mask, types = _tokenize(directory, SENTENCES)
    with torch.no_grad():
        theirs = ref(input_ids=ids, attention_mask=mask, token_type_ids=types)
        mine = ours.model(ids, mask, types)
    hidden_diff = max_diff(
        at_real_tokens(mine.last_hidden_state, mask), at_real_tokens(theirs.last_hidden_state, mask)
    )
    assert hidden_diff <= TOLERANCE
    assert max_diff(mine.pooler_output, theirs.pooler_output) <= TOLERANCE
    # the sentence embedding as sentence-transformers computes it: mean over real tokens, then L2
    ours_embedding = F.normalize(mean_pool(mine.last_hidden_state, mask), dim=-1)
    m = mask.unsqueeze(-1).float()
    reference = F.normalize((theirs.last_hidden_state * m).sum(1) / m.sum(1), dim=-1)
    assert max_diff(ours_embedding, reference) <= 1e-6
    cosine = (ours_embedding * reference).sum(-1)
    assert torch.all(cosine > 1 - 1e-6)


def test_minilm_embedding_defaults():
    directory = default_checkpoint_dir()
    defaults = read_embedding_defaults(directory, 512)
    assert (defaults.pooling, defaults.normalize, defaults.max_length) == ("mean", True, 256)
