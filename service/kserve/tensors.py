"""Open Inference Protocol tensors <-> Python values: the BYTES text input, request parameters, and the
FP32/BYTES outputs. Pure functions; a bad request raises `InvalidInput` naming the field."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bertserve.kserve import open_inference_pb2 as pb
from bertserve.service.core.results import ClassifyResult, EmbedResult, FillMaskResult, ModelInfo
from bertserve.service.engine.tasks import Task
from bertserve.service.errors import InvalidInput, quote

TEXT_INPUT = "text"
PAIR_INPUT = "text_pair"  # optional, for classify: the second text of each input (sentence pairs)
LENGTH_PREFIX = struct.Struct("<I")  # BYTES elements in raw contents: uint32 little-endian length, then bytes


def decode_bytes_elements(raw: bytes, field: str, count: int | None = None) -> list[bytes]:
    """Splits raw BYTES contents (length-prefixed elements, as Triton encodes them) into elements; with
    `count` (the elements the tensor's shape declares), refuses more of them before decoding the rest."""
    elements, offset = [], 0
    view = memoryview(raw)
    while offset < len(raw):
        if count is not None and len(elements) == count:
            raise InvalidInput(
                f"{field}: more than the {count} elements its shape declares ({len(raw) - offset} bytes "
                f"left at byte {offset})"
            )
        if offset + LENGTH_PREFIX.size > len(raw):
            raise InvalidInput(
                f"{field}: {len(raw) - offset} bytes left at byte {offset}, too few for a 4-byte length prefix"
            )
        (length,) = LENGTH_PREFIX.unpack_from(view, offset)
        offset += LENGTH_PREFIX.size
        if offset + length > len(raw):
            raise InvalidInput(
                f"{field}: element {len(elements)} declares {length} bytes at byte {offset}, "
                f"but only {len(raw) - offset} remain"
            )
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    return elements


def encode_bytes_elements(elements: Sequence[bytes]) -> bytes:
    return b"".join(LENGTH_PREFIX.pack(len(e)) + e for e in elements)


def _element_count(shape: Sequence[int], field: str) -> int:
    if len(shape) == 1 or (len(shape) == 2 and shape[1] == 1):
        if shape[0] < 1:
            raise InvalidInput(f"{field}.shape: needs at least one element (got {quote(list(shape))})")
        return int(shape[0])
    raise InvalidInput(f"{field}.shape: must be [n] or [n, 1] (got {quote(list(shape))})")


def tensor_metadata(model: ModelInfo) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    """The classify and fill_mask outputs (the embed ones: service/kserve/embed_tensors.py)."""
    meta = pb.ModelMetadataResponse.TensorMetadata
    outputs = []
    if Task.CLASSIFY.value in model.tasks:
        outputs.append(meta(name="labels", datatype="BYTES", shape=[-1, -1]))
        outputs.append(meta(name="label_scores", datatype="FP32", shape=[-1, -1]))
    if Task.FILL_MASK.value in model.tasks:
        outputs.append(meta(name="mask_tokens", datatype="BYTES", shape=[-1, -1]))
        outputs.append(meta(name="mask_scores", datatype="FP32", shape=[-1, -1]))
        outputs.append(meta(name="mask_sequences", datatype="BYTES", shape=[-1, -1]))
    return outputs


def input_names(classify: bool) -> list[str]:
    """The input tensors of a model: "text", and for one with the classify task the optional "text_pair"."""
    return [TEXT_INPUT, PAIR_INPUT] if classify else [TEXT_INPUT]


def input_names_error(names: list) -> InvalidInput:
    return InvalidInput(
        f"inputs: expected exactly one input tensor {TEXT_INPUT!r} (BYTES), and optionally {PAIR_INPUT!r} "
        f"of the same shape (the second texts of sentence pairs, for classify outputs), got {quote(names)}"
    )


def _read_tensor(request: pb.ModelInferRequest, index: int, max_inputs: int, count: int | None) -> list[str]:
    """The texts of the BYTES input tensor `request.inputs[index]`; `count`: the element count its shape
    must declare (the first tensor's)."""
    tensor = request.inputs[index]
    field = f"inputs[{tensor.name!r}]"
    if tensor.datatype != "BYTES":
        raise InvalidInput(f"{field}.datatype: must be BYTES (UTF-8 text), got {quote(tensor.datatype)}")
    declared = _element_count(tensor.shape, field)
    if declared > max_inputs:
        raise InvalidInput(
            f"{field}.shape: {declared} inputs is more than max_inputs_per_request {max_inputs}"
        )
    if count is not None and declared != count:
        raise InvalidInput(
            f"{field}.shape: {quote(list(tensor.shape))} must match the {count} elements of {TEXT_INPUT!r}"
        )
    if request.raw_input_contents:
        if tensor.HasField("contents"):
            raise InvalidInput(f"{field}.contents: must be empty when raw_input_contents is used")
        if len(request.raw_input_contents) != len(request.inputs):
            raise InvalidInput(
                f"raw_input_contents: {len(request.raw_input_contents)} entries for "
                f"{len(request.inputs)} input tensors"
            )
        raw_field = f"raw_input_contents[{index}]"
        elements = decode_bytes_elements(request.raw_input_contents[index], raw_field, declared)
    else:
        elements = list(tensor.contents.bytes_contents)
    if len(elements) != declared:
        raise InvalidInput(
            f"{field}: shape {quote(list(tensor.shape))} needs {declared} elements, got {len(elements)}"
        )
    texts = []
    for i, element in enumerate(elements):
        try:
            texts.append(element.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{field}[{i}]: not valid UTF-8 at byte {exc.start}") from None
    return texts


def read_texts(request: pb.ModelInferRequest, max_inputs: int) -> tuple[list[str], list[str] | None]:
    """The texts of the request's BYTES input tensor "text", from typed or raw contents, and those of
    "text_pair" (None without it): the second text of each pair, as many as "text" holds."""
    names = [tensor.name for tensor in request.inputs]
    if sorted(names) not in ([TEXT_INPUT], sorted([TEXT_INPUT, PAIR_INPUT])):
        raise input_names_error(names)
    first = names.index(TEXT_INPUT)
    texts = _read_tensor(request, first, max_inputs, None)
    if len(names) == 1:
        return texts, None
    return texts, _read_tensor(request, 1 - first, max_inputs, len(texts))


def pair_tasks(model: str, available: dict[str, Task], names: list[str] | None) -> list[str]:
    """The outputs a request with "text_pair" gets: the classify outputs only (`names` None: all of them)."""
    field = f"inputs[{PAIR_INPUT!r}]"
    classify = [name for name, task in available.items() if task is Task.CLASSIFY]
    if not classify:
        raise InvalidInput(f"{field}: model {model} has no classify task; only classify takes sentence pairs")
    if names is None:
        return classify
    others = [name for name in names if available[name] is not Task.CLASSIFY]
    if others:
        raise InvalidInput(
            f"{field}: only classify takes sentence pairs (outputs {', '.join(classify)}); "
            f"also requested: {', '.join(others)}"
        )
    return names


_PARAMETER_KIND = {bool: "bool_param", int: "int64_param", str: "string_param", float: "double_param"}


def parameter(request: pb.ModelInferRequest, name: str, kind: type, default):
    """The request parameter `name` (bool, int, str or float: a double, or an int64), or `default` when
    absent."""
    if name not in request.parameters:
        return default
    value = request.parameters[name]
    expected = _PARAMETER_KIND[kind]
    choice = value.WhichOneof("parameter_choice")
    if kind is float and choice == "int64_param":
        return float(value.int64_param)
    if choice != expected:
        raise InvalidInput(f"parameters[{name!r}]: must be a {expected} (got {choice})")
    return getattr(value, expected)


# numeric datatypes: their little-endian element type, and the typed contents field that holds them
NUMERIC = {
    "FP32": ("<f4", "fp32_contents"),
    "FP16": ("<f2", None),  # raw contents only
    "INT8": ("i1", "int_contents"),
    "UINT8": ("u1", "uint_contents"),
    "INT32": ("<i4", "int_contents"),
}


@dataclass
class OutputTensor:
    name: str
    datatype: str  # one of NUMERIC, or "BYTES"
    values: np.ndarray  # (n, ...) of that type, or an object array of bytes

    @property
    def shape(self) -> list[int]:
        return list(self.values.shape)


def write_outputs(response: pb.ModelInferResponse, outputs: list[OutputTensor], raw: bool) -> None:
    """Appends the tensors to `response`, in raw_output_contents when `raw`, else in typed contents."""
    for output in outputs:
        tensor = response.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        if output.datatype in NUMERIC:
            dtype, contents = NUMERIC[output.datatype]
            flat = np.ascontiguousarray(output.values, dtype=dtype).ravel()
            if raw or contents is None:
                response.raw_output_contents.append(flat.tobytes())
            else:
                getattr(tensor.contents, contents).extend(flat.tolist())
        else:
            flat = list(output.values.ravel())
            if raw:
                response.raw_output_contents.append(encode_bytes_elements(flat))
            else:
                tensor.contents.bytes_contents.extend(flat)


def fill_mask_tensors(mask_token: str, outcome: FillMaskResult, sequences: bool) -> dict[str, OutputTensor]:
    """The fill_mask outputs (exactly one mask per input) of a core result, for both KServe fronts."""
    for i, masks in enumerate(outcome.masks):
        if len(masks) != 1:
            raise InvalidInput(
                f"inputs[{TEXT_INPUT!r}][{i}]: {len(masks)} {mask_token} "
                "tokens; this protocol takes exactly one per input (bertserve.v1 FillMask takes more)"
            )
    tops = [masks[0] for masks in outcome.masks]
    tensors = {
        "mask_tokens": OutputTensor(
            "mask_tokens", "BYTES", _object_array([[t.encode() for t in top.tokens] for top in tops])
        ),
        "mask_scores": OutputTensor("mask_scores", "FP32", _stack([top.scores for top in tops])),
    }
    if sequences:
        texts = [[text.encode() for text in top.sequences] for top in tops]
        tensors["mask_sequences"] = OutputTensor("mask_sequences", "BYTES", _object_array(texts))
    return tensors


def classify_tensors(outcome: ClassifyResult) -> dict[str, OutputTensor]:
    """The classify outputs of a core result, best label first, for both KServe fronts."""
    labels = [[s.label.encode() for s in row] for row in outcome.labels]
    scores = [[s.score for s in row] for row in outcome.labels]
    return {
        "labels": OutputTensor("labels", "BYTES", _object_array(labels)),
        "label_scores": OutputTensor("label_scores", "FP32", _stack(scores)),
    }


def task_tensors(
    task: Task, outcome: EmbedResult | FillMaskResult | ClassifyResult, mask_token: str, sequences: bool
) -> dict[str, OutputTensor]:
    """One task's outputs from its core result (`InferenceCore.infer`), for both KServe fronts."""
    if task is Task.EMBED:
        return {"embedding": OutputTensor("embedding", "FP32", outcome.vectors)}
    if task is Task.CLASSIFY:
        return classify_tensors(outcome)
    return fill_mask_tensors(mask_token, outcome, sequences)


def _stack(rows) -> np.ndarray:
    return np.asarray(rows, dtype=np.float32)  # (n, width)


def _object_array(rows: list[list[bytes]]) -> np.ndarray:
    out = np.empty((len(rows), len(rows[0]) if rows else 0), dtype=object)  # (n, k)
    for i, row in enumerate(rows):
        out[i, :] = row
    return out
