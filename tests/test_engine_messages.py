"""The engine link's token encodings (service/engine/messages.py): ids as their bytes, all-zero type ids as
None, and what comes back on the engine's side."""

from __future__ import annotations

import numpy as np
import pytest

from bertserve.service.engine.messages import pack, tokens_in, tokens_out, type_ids_in, type_ids_out, unpack


def _through_link(value: object) -> object:
    return unpack(pack(value))


def test_ids_travel_as_bytes_and_come_back_equal():
    ids = np.array([101, 7592, 2088, 102], dtype=np.int64)
    sent = tokens_out(ids)
    assert isinstance(sent, bytes) and len(sent) == ids.nbytes
    back = tokens_in(_through_link(sent))
    assert back.dtype == np.int64 and back.tolist() == ids.tolist()


@pytest.mark.parametrize("ids", [np.array([1, 2, 3], dtype=np.int32), np.zeros((2, 3), dtype=np.int64)])
def test_other_arrays_keep_their_dtype_and_shape(ids):
    back = tokens_in(_through_link(tokens_out(ids)))
    assert back.dtype == ids.dtype and back.shape == ids.shape


def test_type_ids_of_a_pair_are_kept_and_a_single_texts_are_sent_as_none():
    pair = np.array([0, 0, 0, 1, 1], dtype=np.int64)
    assert type_ids_in(_through_link(type_ids_out(pair)), 5).tolist() == pair.tolist()
    assert type_ids_out(np.zeros(5, dtype=np.int64)) is None


@pytest.mark.parametrize("length", [0, 1, 512, 513, 4000])
def test_none_comes_back_as_read_only_zeros_of_the_length(length):
    zeros = type_ids_in(None, length)
    assert zeros.shape == (length,) and zeros.dtype == np.int64 and not zeros.any()
    assert not zeros.flags.writeable  # a view of one shared array: a write would reach every input
    assert type_ids_in(None, 3).shape == (3,)  # a shorter one after a longer one
