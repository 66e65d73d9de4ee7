"""Every `bertserve` subcommand, by the module that registers it, with its one-line description.

A leaf module (it imports nothing): the console script (cli.py) loads the command modules by name from
this table, and the command modules take their descriptions from it, so neither imports the other.
"""

from __future__ import annotations

# module -> {subcommand: one-line description}: listed here so `bertserve --help` imports neither torch
# (export side) nor grpc (serving side); the modules use `describe(command)` for their own help.
COMMAND_MODULES: dict[str, dict[str, str]] = {
    "bertserve.export.commands": {
        "export": "export a BERT checkpoint to a verified ONNX model repository",
        "export-default-heads": "export the default classifier, fill-mask and reranker models beside the default encoder",
    },
    "bertserve.train.heads.commands": {
        "train-heads": "train the WordNet fill-mask and classification heads on the frozen default encoder",
        "assemble-heads": "build the two WordNet head checkpoints from the committed weights",
        "train-reranker": "train the default cross-encoder reranker on WordNet, measured against BM25 and cosine",
        "assemble-reranker": "build the default reranker's checkpoint from the committed weights",
    },
    "bertserve.train.pretrain.commands": {
        "pretrain": "masked-language-model training of a BERT (all or some layers), resumable, evaluated on held-out text",
        "pack-pretrained": "pack the tensors a chain of pretraining stages changed (float16) for the repository",
        "assemble-pretrained": "rebuild the pretrained fill-mask checkpoint from a base model and the trained tensors",
    },
    "bertserve.commands.serve": {
        "serve": "serve a model repository over gRPC, with Prometheus metrics",
    },
    "bertserve.commands.calls": {
        "embed": "client: sentence embeddings of texts",
        "fill-mask": "client: the likeliest tokens for each mask in texts",
        "classify": "client: labels with scores for texts",
        "rerank": "client: documents ranked by relevance to a query, best first",
        "tokenize": "client: the model's tokens of texts, with ids and offsets",
        "info": "client: the server's models, tasks, limits and versions",
    },
    "bertserve.commands.attention": {
        "attention": "client: one attention head's map of a text, as a table (and a PNG with --out)",
    },
    "bertserve.commands.embed_file": {
        "embed-file": "client: embed a file of texts into .npy or .jsonl over EmbedStream (resumable)",
    },
    "bertserve.bench.commands": {
        "bench": "benchmark the server against same-run baselines",
    },
}


def describe(command: str) -> str:
    """The one-line description of a subcommand (COMMAND_MODULES)."""
    for commands in COMMAND_MODULES.values():
        if command in commands:
            return commands[command]
    raise KeyError(command)
