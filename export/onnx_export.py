"""The graphs of a model repository, as PyTorch modules, and their tracing to ONNX.

Each graph module has a fixed signature and output tuple, so the module that is traced is the same
module that `export/verify.py` compares ONNX Runtime against. The TorchScript tracer (dynamo=False)
is used on purpose: its graphs are the ones ONNX Runtime's transformer optimizer fully fuses.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bertserve.export.model import BertForMaskedLM, BertForSequenceClassification, BertModel, mean_pool
from bertserve.repository import (
    ATTENTIONS,
    DECODER_WEIGHT,
    HIDDEN_STATES,
    LAST_HIDDEN_STATE,
    LOGITS,
    POOLER_OUTPUT,
    SENTENCE_EMBEDDING,
    TOKEN_INPUTS,
)

OPSET = 17


class EncoderGraph(nn.Module):
    """(input_ids, attention_mask, token_type_ids) -> last_hidden_state, sentence_embedding[, pooler_output]."""

    def __init__(self, bert: BertModel, pooling: str, with_pooler: bool = True):
        super().__init__()
        self.bert, self.pooling, self.with_pooler = bert, pooling, with_pooler

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.bert(input_ids, attention_mask, token_type_ids)
        hidden = out.last_hidden_state  # (B, T, C)
        sentence = mean_pool(hidden, attention_mask) if self.pooling == "mean" else hidden[:, 0]  # (B, C)
        if out.pooler_output is None or not self.with_pooler:
            return hidden, sentence
        return hidden, sentence, out.pooler_output


class EncoderAttentionsGraph(nn.Module):
    """Unfused variant that also returns attention probabilities, stacked (layers, B, H, T, T)."""

    def __init__(self, bert: BertModel):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.bert(input_ids, attention_mask, token_type_ids, output_attentions=True)
        return out.last_hidden_state, torch.stack(out.attentions, dim=0)


class MlmHeadGraph(nn.Module):
    """Hidden states at the mask positions only: (N, C) -> logits (N, V)."""

    def __init__(self, mlm: BertForMaskedLM):
        super().__init__()
        self.cls = mlm.cls

    def forward(self, hidden_states):
        return self.cls(hidden_states)


class TiedMlmHeadGraph(nn.Module):
    """The MLM head of a decoder tied to the encoder's word embeddings, the table an input rather than a
    weight: (hidden states (N, C), decoder weight (V, C)) -> logits (N, V)."""

    def __init__(self, mlm: BertForMaskedLM):
        super().__init__()
        self.predictions = mlm.cls.predictions

    def forward(self, hidden_states, decoder_weight):
        p = self.predictions
        return torch.nn.functional.linear(p.transform(hidden_states), decoder_weight) + p.bias


class ClassifierHeadGraph(nn.Module):
    """Pooler output (B, C) -> logits (B, L); dropout is the identity at inference."""

    def __init__(self, classifier: BertForSequenceClassification):
        super().__init__()
        self.classifier = classifier.classifier

    def forward(self, pooler_output):
        return self.classifier(pooler_output)


class PoolerClassifierHeadGraph(nn.Module):
    """[CLS] hidden state (B, C) -> the checkpoint's own pooler (dense + tanh) -> logits (B, L). The head of a
    head-only classifier, whose pooler was trained with it and so is not its shared encoder's."""

    def __init__(self, classifier: BertForSequenceClassification):
        super().__init__()
        self.pooler, self.classifier = classifier.bert.pooler, classifier.classifier

    def forward(self, cls_hidden_state):
        return self.classifier(torch.tanh(self.pooler.dense(cls_hidden_state)))  # as BertPooler on [CLS]


@dataclass(frozen=True)
class GraphIO:
    """Names and symbolic shapes of a graph's inputs and outputs (what the manifest records)."""

    inputs: dict[str, list[str | int]]
    outputs: dict[str, list[str | int]]
    input_dtypes: dict[str, str]


def encoder_io(hidden: int, with_pooler: bool) -> GraphIO:
    outputs: dict[str, list[str | int]] = {
        LAST_HIDDEN_STATE: ["batch", "sequence", hidden],
        SENTENCE_EMBEDDING: ["batch", hidden],
    }
    if with_pooler:
        outputs[POOLER_OUTPUT] = ["batch", hidden]
    inputs = {name: ["batch", "sequence"] for name in TOKEN_INPUTS}
    return GraphIO(inputs, outputs, dict.fromkeys(TOKEN_INPUTS, "int64"))


def attentions_io(hidden: int, layers: int, heads: int) -> GraphIO:
    outputs = {
        LAST_HIDDEN_STATE: ["batch", "sequence", hidden],
        ATTENTIONS: [layers, "batch", heads, "sequence", "sequence"],
    }
    inputs = {name: ["batch", "sequence"] for name in TOKEN_INPUTS}
    return GraphIO(inputs, outputs, dict.fromkeys(TOKEN_INPUTS, "int64"))


def mlm_head_io(hidden: int, vocab: int) -> GraphIO:
    return GraphIO({HIDDEN_STATES: ["masks", hidden]}, {LOGITS: ["masks", vocab]}, {HIDDEN_STATES: "float32"})


def tied_mlm_head_io(hidden: int, vocab: int) -> GraphIO:
    return GraphIO(
        {HIDDEN_STATES: ["masks", hidden], DECODER_WEIGHT: [vocab, hidden]},
        {LOGITS: ["masks", vocab]},
        {HIDDEN_STATES: "float32", DECODER_WEIGHT: "float32"},
    )


def classifier_head_io(hidden: int, labels: int, source: str = POOLER_OUTPUT) -> GraphIO:
    """`source`: pooler_output (the encoder's pooler) or cls_hidden_state (the head holds its pooler)."""
    return GraphIO({source: ["batch", hidden]}, {LOGITS: ["batch", labels]}, {source: "float32"})


def example_inputs(io: GraphIO, batch: int = 2, sequence: int = 8) -> tuple[torch.Tensor, ...]:
    """Inputs for tracing; sizes are arbitrary since every named axis is exported dynamic."""
    tensors = []
    for name, shape in io.inputs.items():
        size = [batch if d in ("batch", "masks") else sequence if d == "sequence" else d for d in shape]
        if io.input_dtypes[name] == "int64":
            tensors.append(
                torch.ones(size, dtype=torch.long)
                if name == "attention_mask"
                else torch.zeros(size, dtype=torch.long)
            )
        else:
            tensors.append(torch.zeros(size, dtype=torch.float32))
    return tuple(tensors)


def trace_to_onnx(graph: nn.Module, io: GraphIO, path: Path, opset: int = OPSET) -> Path:
    dynamic_axes = {}
    for name, shape in {**io.inputs, **io.outputs}.items():
        dynamic_axes[name] = {i: d for i, d in enumerate(shape) if isinstance(d, str)}
    graph.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            graph,
            example_inputs(io),
            str(path),
            input_names=list(io.inputs),
            output_names=list(io.outputs),
            dynamic_axes=dynamic_axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    return path
