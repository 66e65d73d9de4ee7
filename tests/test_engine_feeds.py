"""A batch's feeds built from bytes (service/engine/feeds.py) and its vectors finished in whole-array steps
(service/engine/tasks/embed.py): the same values as the per-row writes and per-subset norms they replace."""

from __future__ import annotations

import numpy as np
import pytest

from bertserve.service.engine.batch_items import WorkItem
from bertserve.service.engine.feeds import batch_feeds
from bertserve.service.engine.tasks import Task, TaskOptions
from bertserve.service.engine.tasks.embed import finish_embeddings

PAD = 0


def _item(ids: list[int], type_ids: list[int] | None = None, dtype=np.int64) -> WorkItem:
    types = np.array(type_ids if type_ids is not None else [0] * len(ids), dtype=dtype)
    return WorkItem(np.array(ids, dtype=dtype), types, TaskOptions(Task.EMBED), None)


def _reference(batch: list[WorkItem], shape: tuple[int, int], pad_id: int) -> dict[str, np.ndarray]:
    ids, mask, types = np.full(shape, pad_id, np.int64), np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    mask[len(batch) :, 0] = 1
    for row, item in enumerate(batch):
        ids[row, : item.length], mask[row, : item.length] = item.ids, 1
        types[row, : item.length] = item.type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


@pytest.mark.parametrize("pad_id", [0, 1, 30521])
@pytest.mark.parametrize("shape", [(3, 5), (4, 8), (6, 12)])  # exact, then a bucket's spare rows and length
def test_feeds_equal_the_per_row_writes(shape, pad_id):
    batch = [_item([101, 7, 102]), _item([101, 8, 9, 10, 102], [0, 0, 0, 1, 1]), _item([101, 102])]
    got, want = batch_feeds(batch, shape, pad_id), _reference(batch, shape, pad_id)
    for name, array in want.items():
        assert got[name].dtype == np.int64 and got[name].shape == shape
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_ids_of_another_integer_type_are_widened():
    batch = [_item([101, 70000, 102], dtype=np.int32)]
    assert batch_feeds(batch, (1, 4), PAD)["input_ids"].tolist() == [[101, 70000, 102, PAD]]


def _reference_vectors(pooled, normalize, dimensions):
    out = []
    for row, keep, size in zip(pooled, normalize, dimensions, strict=True):
        vector = row[: size or len(row)].astype(np.float32)
        out.append(vector / max(np.linalg.norm(vector), 1e-12) if keep else vector)
    return out


@pytest.mark.parametrize(
    ("normalize", "dimensions"),
    [
        ([True, True, True], [0, 0, 0]),  # the usual batch: whole-array steps
        ([False, False, False], [0, 0, 0]),
        ([True, False, True], [0, 0, 0]),
        ([True, True, False], [2, 0, 2]),
        ([False, True, True], [3, 3, 0]),
    ],
)
def test_vectors_equal_each_rows_own_cut_and_norm(normalize, dimensions):
    pooled = np.array([[3.0, 4.0, 0.0, 1.0], [1.0, 2.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    got = finish_embeddings(pooled, np.array(normalize), np.array(dimensions))
    for vector, want in zip(got, _reference_vectors(pooled, normalize, dimensions), strict=True):
        assert vector.dtype == np.float32
        np.testing.assert_allclose(vector, want, rtol=1e-6, atol=1e-7)
    assert np.all(pooled[0] == [3.0, 4.0, 0.0, 1.0])  # the graph's output is left as it was


def test_a_vector_does_not_depend_on_whether_its_batch_mates_normalize():
    pooled = np.random.default_rng(0).standard_normal((64, 384)).astype(np.float32)
    all_rows = finish_embeddings(pooled, np.ones(64, bool))
    mixed = np.ones(64, bool)
    mixed[7] = False
    one_left_out = finish_embeddings(pooled, mixed)
    for row in range(64):
        if row != 7:
            assert np.array_equal(all_rows[row], one_left_out[row]), row  # bit for bit
    assert np.array_equal(one_left_out[7], pooled[7])
