"""Messages between fronts and the engine process: pickled tuples whose numpy arrays travel as their own
ZeroMQ frames (pickle protocol 5, out of band), so an array is copied only by the socket itself.

Only this server's own processes can connect: the socket lives in a directory private to its user
(service/supervisor/processes.py), so unpickling a message trusts no one else.

Front -> engine: ("hello",) | ("submit", call, encoder, bulk, deadline, items) | ("cancel", call) |
("attention", call, encoder, model, ids, type_ids, layers, heads, deadline).
Engine -> front: ("hello", {encoder: (provider, device)}, {model: version}) | ("done", call, results) |
("error", call, error class name, message) | ("cancelled", call): every call is answered exactly once, a
cancelled one too, so a front frees a call's room only when the engine no longer holds its inputs.
`results`: (value, queue_s, inference_s, batch_id) per item.
"""

from __future__ import annotations

import pickle


def pack(message: tuple) -> list:
    """The frames of `message`: the pickle, then each out-of-band buffer (sent without a copy)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    return [head, *(b.raw() for b in buffers)]


def unpack(frames: list) -> tuple:
    """`frames` from `pack` (zmq Frames or bytes) back into the message; arrays view the frames' memory."""
    head, *buffers = frames
    return pickle.loads(memoryview(head), buffers=[memoryview(b) for b in buffers])
