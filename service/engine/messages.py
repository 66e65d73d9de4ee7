"""Messages between fronts and the engine process: pickled tuples whose large numpy arrays travel as buffers
of their own (pickle protocol 5, out of band), so such an array is copied only by the socket itself. What
one event-loop turn posts for a peer leaves as one frame, the list of them (service/engine/frame_link.py).

Only this server's own processes can connect: the socket lives in a directory private to its user
(service/supervisor/processes.py), so unpickling a message trusts no one else.

Front -> engine: ("hello",) | ("submit", call, encoder, bulk, deadline, items) | ("cancel", call) |
("attention", call, encoder, model, ids, type_ids, layers, heads, deadline).
Engine -> front: ("hello", {encoder: (provider, device)}, {model: version}) | ("done", call, results) |
("error", call, error class name, message) | ("cancelled", call): every call is answered exactly once, a
cancelled one too, so a front frees a call's room only when the engine no longer holds its inputs.
`items`: (model, options, ids, type_ids, mask positions) per input; `results`: (value, queue_s,
inference_s, batch_id) per input. Ids travel as `tokens_out`'s bytes, type ids as `type_ids_out`'s (None:
all 0), other small arrays as `small` tuples and options as `options_out`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle

import numpy as np

from bertserve.service.engine.tasks import Task, TaskOptions

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
