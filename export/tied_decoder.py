"""An MLM head whose decoder is tied to the encoder's word embeddings, exported without its own copy.

An MLM model whose decoder weight is bit-identical to its checkpoint's word-embedding table, and that table
bit-identical to an initializer of the fp32 encoder graph it runs beside (its encoder model's, for a head-only
model: `bertserve export --encoder`; else its own), gets a head graph that takes the table as an input
(`decoder_weight`); the table is written once as a .npy file, and the manifest names, per encoder graph, the
initializer that holds the same bytes (the server hands that encoder session the same array: one table in the
process, not one per graph). Anything else keeps the self-contained head graph.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from bertserve.export.checkpoint import MASKED_LM, Checkpoint
from bertserve.export.shared_encoder import SharedEncoder
from bertserve.repository import (
    DECODER_WEIGHT,
    DECODER_WEIGHT_FILE,
    ENCODER,
    ENCODER_KEYS,
    TiedDecoder,
    graph_file,
    sha256_file,
)


def tied_table(checkpoint: Checkpoint) -> np.ndarray | None:
    """The decoder weight (V, C) float32 when it is bit-identical to the word embeddings, else None."""
    if checkpoint.architecture != MASKED_LM:
        return None
    decoder = checkpoint.model.cls.predictions.decoder.weight.detach().cpu().numpy()
    words = checkpoint.encoder.embeddings.word_embeddings.weight.detach().cpu().numpy()
    if decoder.dtype != np.float32 or decoder.shape != words.shape or decoder.tobytes() != words.tobytes():
        return None
    return np.ascontiguousarray(decoder)


def matching_initializer(graph_path: Path, table: np.ndarray) -> str | None:
    """The name of the initializer of `graph_path` with `table`'s dtype, shape and bytes, if any."""
    model = onnx.load(str(graph_path), load_external_data=True)
    for initializer in model.graph.initializer:
        if tuple(initializer.dims) != table.shape or initializer.data_type != onnx.TensorProto.FLOAT:
            continue
        if numpy_helper.to_array(initializer).tobytes() == table.tobytes():
            return initializer.name
    return None


def encoder_graphs(shared: SharedEncoder | None, stage_dir: Path) -> dict[str, Path]:
    """The encoder graphs the head will run beside: the shared encoder model's, else the model's own
    (already written to the version being staged: the encoder variants are built before the heads)."""
    if shared is not None:
        return {k: shared.directory / s.file for k, s in shared.manifest.graphs.items() if k in ENCODER_KEYS}
    return {k: stage_dir / graph_file(k) for k in ENCODER_KEYS if (stage_dir / graph_file(k)).is_file()}


def plan(checkpoint: Checkpoint, graphs: dict[str, Path]) -> tuple[np.ndarray, dict[str, str]] | None:
    """(table, encoder initializers) when the head is tied to the fp32 encoder's table, else None."""
    table = tied_table(checkpoint)
    if table is None:
        return None
    initializers = {}  # graph key -> its initializer holding the table (int8 or fp16 graphs have none)
    for key, path in graphs.items():
        if name := matching_initializer(path, table):
            initializers[key] = name
    if ENCODER not in initializers:  # the encoder's table is not this one: keep a self-contained head
        return None
    return table, initializers


def gemm_on_the_table(path: Path) -> None:
    """Rewrites the traced MatMul(x, Transpose(decoder_weight)) as Gemm(x, decoder_weight, transB=1), in place:
    the Transpose would copy the whole table on every run (x is 2-D, (N, C), so Gemm applies)."""
    model = onnx.load(str(path))
    nodes = list(model.graph.node)
    (transpose,) = [n for n in nodes if n.op_type == "Transpose" and list(n.input) == [DECODER_WEIGHT]]
    (matmul,) = [n for n in nodes if n.op_type == "MatMul" and list(n.input)[1:] == [transpose.output[0]]]
    if any(transpose.output[0] in n.input for n in nodes if n is not matmul):
        raise ValueError(f"{path.name}: the transposed decoder weight has other uses")
    gemm = onnx.helper.make_node(
        "Gemm", [matmul.input[0], DECODER_WEIGHT], list(matmul.output), name="decoder_gemm", transB=1
    )
    kept = [gemm if n is matmul else n for n in nodes if n is not transpose]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def write_table(table: np.ndarray, directory: Path, initializers: dict[str, str]) -> TiedDecoder:
    path = Path(directory) / DECODER_WEIGHT_FILE
    np.save(path, table, allow_pickle=False)
    return TiedDecoder(
        sha256=sha256_file(path), shape=list(table.shape), encoder_initializers=dict(initializers)
    )
