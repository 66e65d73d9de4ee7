"""ONNX Runtime's transformer optimizer, int8 dynamic quantization and float16 conversion.

The CPU graphs (fp32 and the int8 made from it) are ORT's fused graph with two operators split again:
- SkipLayerNormalization into the residual Add, the bias Add and the standard LayerNormalization: ONNX
  Runtime 1.32's CPU kernel for the fused op takes about twice as long as the three (MiniLM, 2 threads,
  mixed corpus, per-op profile at batch 3: 357 against 180 ms fp32, 336 against 159 ms int8; the pass 9%
  and 12% faster, results equal to 4e-5). The residual Add comes first: ORT's own SkipLayerNorm fusion
  matches the bias Add first and would fuse the three back when a session loads the graph.
- BiasGelu into the bias Add and Gelu: ORT fuses the fp32 graph's pair back into BiasGelu at load, while in
  the int8 graph the bias joins the quantized MatMul before it and Gelu runs alone (int8, batch 3 and 8:
  about 5% more inputs/s).
The float16 graph, which is for CUDA, keeps ORT's fused operators (one kernel each there).
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from onnx import helper

from bertserve.export.errors import ExportError

FUSED_OPERATORS = (
    "EmbedLayerNormalization",
    "Attention",
    "SkipLayerNormalization",
    "LayerNormalization",
    "BiasGelu",
    "Gelu",
    "FastGelu",
)


def _quiet_onnxruntime_tools() -> None:
    for name in ("onnx_model", "fusion_base", "onnxruntime.transformers", "root"):
        logging.getLogger(name).setLevel(logging.ERROR)


def optimize_encoder(
    raw: Path, fused: Path, out: Path, num_heads: int, hidden_size: int
) -> tuple[dict[str, int], dict[str, int]]:
    """Fuses the traced encoder with ORT's optimizer (offline, opt_level 0 so the file runs on any
    provider) into `fused`, and writes `out`, the CPU graph: the same with its SkipLayerNormalizations and
    BiasGelus split (`split_for_cpu`). Returns the fused operators of `fused` and of `out`, by type."""
    from onnxruntime.transformers import optimizer

    _quiet_onnxruntime_tools()
    model = optimizer.optimize_model(
        str(raw), model_type="bert", num_heads=num_heads, hidden_size=hidden_size, opt_level=0
    )
    model.save_model_to_file(str(fused))
    ort_fusions = fused_operators(model.model)
    split_for_cpu(model.model)
    model.save_model_to_file(str(out))
    return ort_fusions, fused_operators(model.model)


def fused_operators(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in FUSED_OPERATORS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def split_for_cpu(model: onnx.ModelProto) -> None:
    """The CPU graph's rewrites of ORT's fused graph, in place (see the module's docstring)."""
    split_skip_layer_norms(model)
    split_bias_gelus(model)


def split_bias_gelus(model: onnx.ModelProto) -> int:
    """Rewrites each BiasGelu(input, bias) as Gelu(input + bias), in place. Returns how many were split."""
    nodes, split = [], 0
    for node in model.graph.node:
        if node.op_type != "BiasGelu":
            nodes.append(node)
            continue
        biased = f"{node.output[0]}_biased"  # outputs are unique in a graph; node names may be empty
        nodes.append(helper.make_node("Add", list(node.input[:2]), [biased], name=f"{node.name}_add_bias"))
        nodes.append(
            helper.make_node("Gelu", [biased], [node.output[0]], name=node.name, domain="com.microsoft")
        )
        split += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return split


def split_skip_layer_norms(model: onnx.ModelProto) -> int:
    """Rewrites each SkipLayerNormalization(input, skip, gamma, beta, bias) as
    LayerNormalization(input + skip + bias, gamma, beta) over the last axis, in place; its optional fourth
    output (the sum) stays available. Those without a bias stay fused. Returns how many were split."""
    nodes, split = [], 0
    for node in model.graph.node:
        # without a bias ORT fuses the Add and LayerNormalization back at load: nothing to gain
        if node.op_type != "SkipLayerNormalization" or len(node.input) < 5 or not node.input[4]:
            nodes.append(node)
            continue
        if any(node.output[1:3]):
            raise ExportError(f"{node.name}: its mean or inverse-deviation output is used; cannot split it")
        x, skip, gamma, beta, bias = (list(node.input) + [""] * 5)[:5]
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        # intermediate names from the output's, unique in a graph (node names may be empty)
        total = node.output[3] if len(node.output) > 3 and node.output[3] else f"{node.output[0]}_sum"
        residual = f"{node.output[0]}_residual"
        nodes.append(helper.make_node("Add", [x, skip], [residual], name=f"{node.name}_add"))
        nodes.append(helper.make_node("Add", [residual, bias], [total], name=f"{node.name}_add_bias"))
        normalized = [total, gamma] + ([beta] if beta else [])
        nodes.append(
            helper.make_node(
                "LayerNormalization", normalized, [node.output[0]], name=node.name, axis=-1, epsilon=epsilon
            )
        )
        split += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return split


def convert_fp16(fp32: Path, out: Path) -> None:
    """float16 weights and activations; inputs and outputs stay float32/int64 (keep_io_types). `fp32` is
    the fused graph (`optimize_encoder`'s `fused`): this graph is for CUDA."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    _quiet_onnxruntime_tools()
    model = OnnxModel(onnx.load(str(fp32)))
    model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(out))


def quantize_int8(fp32: Path, out: Path) -> None:
    """Dynamic quantization, int8 weights per output channel, activations quantized at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _quiet_onnxruntime_tools()
    try:
        quantize_dynamic(
            str(fp32),
            str(out),
            per_channel=True,
            weight_type=QuantType.QInt8,
            extra_options={
                "DefaultTensorType": onnx.TensorProto.FLOAT
            },  # the fused ops lack type info otherwise
        )
    except Exception as e:  # the quantizer raises bare exceptions on graphs it cannot handle
        raise ExportError(f"int8 quantization failed ({type(e).__name__}: {e})") from None


def opset_of(path: Path) -> int:
    model = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
