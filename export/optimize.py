"""ONNX Runtime's transformer optimizer, int8 dynamic quantization and float16 conversion."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx

from bertserve.export.errors import ExportError

FUSED_OPERATORS = (
    "EmbedLayerNormalization",
    "Attention",
    "SkipLayerNormalization",
    "BiasGelu",
    "Gelu",
    "FastGelu",
)


def _quiet_onnxruntime_tools() -> None:
    for name in ("onnx_model", "fusion_base", "onnxruntime.transformers", "root"):
        logging.getLogger(name).setLevel(logging.ERROR)


def optimize_encoder(raw: Path, out: Path, num_heads: int, hidden_size: int) -> dict[str, int]:
    """Fuses the traced encoder (offline, opt_level 0 so the file runs on any provider). Returns fusion counts."""
    from onnxruntime.transformers import optimizer

    _quiet_onnxruntime_tools()
    model = optimizer.optimize_model(
        str(raw), model_type="bert", num_heads=num_heads, hidden_size=hidden_size, opt_level=0
    )
    counts = {
        k: int(v) for k, v in model.get_fused_operator_statistics().items() if v and k in FUSED_OPERATORS
    }
    model.save_model_to_file(str(out))
    return counts


def convert_fp16(fp32: Path, out: Path) -> None:
    """float16 weights and activations; inputs and outputs stay float32/int64 (keep_io_types)."""
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
