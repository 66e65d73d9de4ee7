"""Floating-point operations of one encoder forward pass, from the model's dimensions.

Counted as 2 operations per multiply-add, matmuls only (embeddings, layer norms, softmax and GELU are
a few percent at these sizes and are left out), per layer for T tokens, hidden H, intermediate I:

    Q, K, V and output projections   2 * T * 4 * H * H
    feed-forward up and down         2 * T * 2 * H * I
    attention scores and context     4 * T * T * H       (Q @ K^T and P @ V over all heads)

Padding is not counted: these are the useful operations for the real tokens of each input.
"""

from __future__ import annotations

from bertserve.manifest import ModelDimensions


def encoder_flops(dimensions: ModelDimensions, tokens: int) -> float:
    h, i, t = dimensions.hidden_size, dimensions.intermediate_size, tokens
    per_layer = 2 * t * (4 * h * h + 2 * h * i) + 4 * t * t * h
    return float(dimensions.num_hidden_layers * per_layer)


def corpus_flops(dimensions: ModelDimensions, token_counts: list[int]) -> float:
    """Total FLOPs to encode inputs of the given lengths one by one (no padding)."""
    return sum(encoder_flops(dimensions, t) for t in token_counts)
