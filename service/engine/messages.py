"""Messages between fronts and the engine process: pickled tuples whose large numpy arrays travel as buffers
of their own (pickle protocol 5, out of band), so such an array is copied only by the socket itself. What
one event-loop turn posts for a peer leaves as one frame, the list of them (service/engine/frame_link.py).

Only this server's own processes can connect: the socket lives in a directory private to its user
(service/supervisor/processes.py), so unpickling a message trusts no one else.

Front -> engine: ("hello",) | ("submit", call, encoder, bulk, deadline, inputs) | ("lones", calls, encoders,
models, options, ids, lengths, type_ids, masks, deadlines) | ("cancel", call) | ("attention", call, encoder,
model, ids, type_ids, layers, heads, deadline). `lones` carries a turn's unary calls of one input and one
option (`lones_out`), field by field.
Engine -> front: ("hello", {encoder: (provider, device)}, {model: version}) | ("done", call, results) |
("rows", calls, values, queue_s, inference_s, batch_ids) | ("error", call, error class name, message) |
("cancelled", call): every call is answered exactly once, a cancelled one too, so a front frees a call's
room only when the engine no longer holds its inputs. `rows` answers the single-input calls of one turn
together (`rows_out`): a call of one input and one option is most calls under load.
A call travels whole, not input by input: `inputs` is `inputs_out`'s (the model's name, the options, every
input's ids joined with their lengths, type ids joined or None when all 0, mask positions or None), `results`
`results_out`'s (the values, stacked into one array when they are arrays of one shape, then each row's
queue_s, inference_s and batch_id). Small arrays travel as `small` tuples and options as `options_out`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

import numpy as np

from bertserve.service import errors
from bertserve.service.engine.batch_items import ItemResult
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.unary_calls import CallInputs

# Buffers smaller than this travel inside the pickle: a buffer of its own costs more than the copy.
IN_BAND_BYTES = 65536


def pack(message: object) -> list:
    """The frames of `message`: the pickle, then each large out-of-band buffer (sent without a copy)."""
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < IN_BAND_BYTES:
            return True  # in band
        buffers.append(buffer)
        return False

    head = pickle.dumps(message, protocol=5, buffer_callback=out_of_band)
    return [head, *(b.raw() for b in buffers)]


def unpack(frames: list) -> object:
    """`frames` from `pack` (bytes-like) back into the message; arrays view the frames' memory."""
    head, *buffers = frames
    return pickle.loads(memoryview(head), buffers=[memoryview(b) for b in buffers])


def small(value: object) -> object:
    """An array under IN_BAND_BYTES as (bytes, dtype, shape), which pickle writes and reads several times
    faster than the array itself; anything else as is (a larger array travels out of band)."""
    if isinstance(value, np.ndarray) and value.nbytes < IN_BAND_BYTES:
        return (value.tobytes(), value.dtype.str, value.shape)
    return value


def array(value: object) -> object:
    """`small`'s value back (the array views the message's bytes: read-only)."""
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], bytes):
        data, dtype, shape = value
        return np.frombuffer(data, dtype).reshape(shape)
    return value


def tokens_out(value: np.ndarray) -> object:
    """A 1-D int64 array of token ids as its bytes alone (half `small`'s cost each way), else as `small`'s."""
    if value.dtype == np.int64 and value.ndim == 1 and value.nbytes < IN_BAND_BYTES:
        return value.tobytes()
    return small(value)


def tokens_in(value: object) -> object:
    """`tokens_out`'s array back (read-only, viewing the message's bytes)."""
    return np.frombuffer(value, np.int64) if isinstance(value, bytes) else array(value)


def type_ids_out(value: np.ndarray) -> object:
    """Token type ids as `tokens_out`'s, or None when all are 0 (a single text's; count_nonzero: a fifth of
    `any()`'s cost on a short array)."""
    return tokens_out(value) if np.count_nonzero(value) else None


_zeros = np.zeros(512, np.int64)  # grown when a longer input comes
_zeros.flags.writeable = False


def type_ids_in(value: object, length: int) -> np.ndarray:
    """`type_ids_out`'s array back: None as `length` zeros (a read-only view of one shared array)."""
    global _zeros
    if value is not None:
        return tokens_in(value)
    if length > _zeros.shape[0]:
        _zeros = np.zeros(max(length, 2 * _zeros.shape[0]), np.int64)
        _zeros.flags.writeable = False
    return _zeros[:length]


@functools.lru_cache(maxsize=1024)
def options_out(options: TaskOptions) -> tuple:
    """A call's options as the tuple of their fields' values (the task by its value)."""
    return tuple(v.value if isinstance(v, Task) else v for v in dataclasses.astuple(options))


@functools.lru_cache(maxsize=1024)
def options_in(fields: tuple) -> TaskOptions:
    """`options_out`'s options back."""
    return TaskOptions(Task(fields[0]), *fields[1:])


def inputs_out(
    model: str, options: list[TaskOptions], ids: list, type_ids: list, masks: list | None
) -> tuple:
    """A call's inputs (`CallInputs`' fields) as a `submit` message carries them (lengths None: one input)."""
    options = tuple(map(options_out, options))
    marks = None if masks is None else [small(m) for m in masks]
    if len(ids) == 1:  # most calls: nothing joined, nothing to split
        return model, options, tokens_out(ids[0]), None, type_ids_out(type_ids[0]), marks
    lengths = tuple(len(row) for row in ids)
    types = type_ids_out(np.concatenate(type_ids))
    return model, options, tokens_out(np.concatenate(ids)), lengths, types, marks


def inputs_in(message: tuple, models: Mapping[str, Any], deadline: float | None, bulk: bool) -> CallInputs:
    """`inputs_out`'s call back, its model looked up in `models` by name (KeyError: not there); each array a
    view of the message's bytes (all-0 type ids: of the shared zeros; read-only in band)."""
    model, options, ids, lengths, type_ids, masks = message
    ids = tokens_in(ids)
    types = type_ids_in(type_ids, ids.shape[0])
    if lengths is None:
        rows, type_rows = [ids], [types]
    else:
        ends = list(accumulate(lengths))
        starts = [0, *ends[:-1]]
        rows = [ids[a:b] for a, b in zip(starts, ends, strict=True)]
        type_rows = [types[a:b] for a, b in zip(starts, ends, strict=True)]
    marks = None if masks is None else [array(m) for m in masks]
    return CallInputs(models[model], rows, type_rows, list(map(options_in, options)), deadline, bulk, marks)


def lones_out(calls: list[tuple]) -> tuple:
    """The `lones` message: single-input calls of one turn, each (call, encoder, model, options, ids, type
    ids, fill-mask's mask positions or None, deadline), their ids joined (and type ids, or None when all are
    0; masks None when none has any), the rest field by field."""
    numbers, encoders, models, options, ids, type_ids, masks, deadlines = zip(*calls, strict=True)
    lengths = tuple(map(len, ids))
    joined = tokens_out(np.concatenate(ids)) if len(ids) > 1 else tokens_out(ids[0])
    types = type_ids_out(np.concatenate(type_ids))
    marks = None if all(m is None for m in masks) else tuple(None if m is None else small(m) for m in masks)
    options = tuple(map(options_out, options))
    return "lones", numbers, encoders, models, options, joined, lengths, types, marks, deadlines


def lones_in(message: tuple) -> zip:
    """`lones_out`'s calls back, each (call, encoder, model, options, ids, type ids, mask positions or None,
    deadline), the arrays views of the message's (read-only)."""
    _, numbers, encoders, models, options, joined, lengths, types, masks, deadlines = message
    ids = tokens_in(joined)
    types = type_ids_in(types, ids.shape[0])
    ends = list(accumulate(lengths))
    starts = [0, *ends[:-1]]
    rows = [ids[a:b] for a, b in zip(starts, ends, strict=True)]
    type_rows = [types[a:b] for a, b in zip(starts, ends, strict=True)]
    marks = [None] * len(numbers) if masks is None else [None if m is None else array(m) for m in masks]
    options = map(options_in, options)
    return zip(numbers, encoders, models, options, rows, type_rows, marks, deadlines, strict=True)


def error_out(call: int, exc: BaseException) -> tuple:
    """The `error` answer to `call`: a domain error by its class, anything else as InferenceFailed."""
    if isinstance(exc, errors.ServiceError):
        return ("error", call, type(exc).__name__, str(exc))
    return ("error", call, "InferenceFailed", f"the engine failed: {exc}")


def results_out(results: list[ItemResult]) -> tuple:
    """A call's results as a `done` message carries them: one result as its fields; several with their
    values stacked when they are arrays of one shape and type (one copy and one pickled object for the
    call), else each as `small`'s, and each field's values in a tuple."""
    if not results:
        return [], (), (), ()
    if len(results) == 1:
        one = results[0]
        return small(one[0]), one[1], one[2], one[3]
    values, queue_s, inference_s, batch_ids = zip(*results, strict=True)
    return _values_out(values), queue_s, inference_s, batch_ids


def results_in(message: tuple) -> list[ItemResult]:
    """`results_out`'s results back, in order (a stacked array's rows are views of it)."""
    packed, queue_s, inference_s, batch_ids = message
    if not isinstance(queue_s, tuple):  # one result
        return [ItemResult(array(packed), queue_s, inference_s, batch_ids)]
    return list(map(ItemResult, _values_in(packed), queue_s, inference_s, batch_ids))


def rows_out(rows: list[tuple[int, ItemResult]]) -> tuple:
    """The `rows` answer: single-input calls answered in one turn, each (call, its ItemResult), with their
    values stacked into one array when they are arrays of one shape and type (one pickled object)."""
    calls, results = zip(*rows, strict=True)
    values, queue_s, inference_s, batch_ids = zip(*results, strict=True)
    return "rows", calls, _values_out(values), queue_s, inference_s, batch_ids


def rows_in(message: tuple) -> zip:
    """`rows_out`'s calls back, each (call, its result as `results_in` reads one)."""
    _, calls, packed, queue_s, inference_s, batch_ids = message
    return zip(calls, zip(_values_in(packed), queue_s, inference_s, batch_ids, strict=True), strict=True)


def _values_out(values: tuple) -> object:
    first = values[0]
    same = isinstance(first, np.ndarray) and all(
        isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values
    )
    return small(np.stack(values)) if same else [small(v) for v in values]


def _values_in(packed: object) -> list:
    return [array(v) for v in packed] if isinstance(packed, list) else list(array(packed))
