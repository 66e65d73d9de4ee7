"""The client commands (`bertserve embed|fill-mask|classify|tokenize|info`) and the tasks' numerics."""

from __future__ import annotations

import json

import numpy as np

from bertserve.cli import main
from bertserve.service.tasks.classify import label_scores, ranked
from bertserve.service.tasks.embed import finish_embeddings
from bertserve.service.tasks.fill_mask import top_k


def test_client_commands(tiny_server, capsys):
    address = ["--address", tiny_server.address]
    assert main(["embed", *address, "--json", "--model", "tiny-embed", "a cat", "a dog"]) == 0
    embedded = json.loads(capsys.readouterr().out)
    assert len(embedded["embeddings"]) == 2 and len(embedded["embeddings"][0]["values"]) == 48
    assert embedded["metadata"]["model"] == "tiny-embed"
    assert main(["fill-mask", *address, "--top-k", "2", "the [MASK] sat"]) == 0
    assert "token 2:" in capsys.readouterr().out
    assert main(["classify", *address, "--json", "--top-k", "1", "a cat"]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"][0]["labels"]) == 1
    assert main(["tokenize", *address, "--model", "tiny-embed", "a cat"]) == 0
    assert "[CLS](" in capsys.readouterr().out
    assert main(["info", *address]) == 0
    assert "tiny-mlm v1" in capsys.readouterr().out
    assert main(["embed", *address, "--model", "nope", "x"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err


def test_task_numerics():
    logits = np.array([[1.0, 3.0, 3.0, -2.0]])
    ids, scores = top_k(logits, 3)
    assert ids.tolist() == [[1, 2, 0]]  # ties broken by the lower id
    expected = np.exp(logits) / np.exp(logits).sum()
    assert np.allclose(scores, expected[0, [1, 2, 0]])
    sigmoid = label_scores(np.array([0.0, 2.0]), "multi_label_classification", raw_scores=False)
    assert np.allclose(sigmoid, 1 / (1 + np.exp(-np.array([0.0, 2.0]))))
    assert np.allclose(label_scores(np.array([0.5, -1.0]), "single_label_classification", True), [0.5, -1.0])
    assert ranked(np.array([0.1, 0.7, 0.2], dtype=np.float32), 2) == [
        (1, np.float32(0.7)),
        (2, np.float32(0.2)),
    ]
    vectors = finish_embeddings(np.array([[3.0, 4.0], [3.0, 4.0]], np.float32), np.array([True, False]))
    assert np.allclose(vectors, [[0.6, 0.8], [3.0, 4.0]])
