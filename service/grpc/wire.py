"""Protobuf wire encoding of numpy arrays, for responses too large to build field by field.

A proto3 `repeated float` is packed on the wire: tag, byte length, then the little-endian float32 values.
Writing that from `ndarray.tobytes()` costs one copy, where filling the field from Python
(`values=array.tolist()`) costs a Python float per value. Serialized messages concatenate: appending an
encoded field to a serialized message appends to that repeated field, so a response can be serialized
with protobuf for its small fields and with these functions for its arrays, and parses the same.
"""

from __future__ import annotations

import numpy as np

LENGTH_DELIMITED = 2


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """A length-delimited field (a message, bytes, or a packed repeated scalar) with its tag."""
    return varint(field_number << 3 | LENGTH_DELIMITED) + varint(len(payload)) + payload


def packed_floats(field_number: int, values: np.ndarray) -> bytes:
    """`repeated float` field `field_number` holding `values` (any shape, row-major), as proto3 packs it."""
    return length_delimited(field_number, np.ascontiguousarray(values, dtype="<f4").tobytes())
