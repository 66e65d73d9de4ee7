"""The HTTP front's JSON writer (service/http/messages.py `json_bytes`): numpy arrays written directly, each
value reading back as itself in its own dtype, and what orjson refuses written by the json module."""

import json

import numpy as np
import pytest

from bertserve.service.http.messages import json_bytes, json_response


def test_float32_rows_read_back_exactly_and_short():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((4, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    body = json_bytes({"data": [{"index": i, "embedding": row} for i, row in enumerate(vectors)]})
    got = np.array([d["embedding"] for d in json.loads(body)["data"]], dtype=np.float32)
    assert np.array_equal(got, vectors)
    # float32's shortest forms, not float64's 17 digits: about 11 bytes a value
    assert len(body) < 13 * vectors.size


@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.uint8, np.int64, np.float64])
def test_other_dtypes_and_views(dtype):
    values = (np.arange(-24, 24).reshape(6, 8) * 3).astype(dtype)
    for array in (values, values[:, ::2], values.T):  # contiguous, strided, Fortran order
        got = np.array(json.loads(json_bytes({"v": array}))["v"], dtype=dtype)
        assert np.array_equal(got, array)
    assert json.loads(json_bytes([values[0, 0], np.float32(0.5)])) == [values[0, 0].item(), 0.5]


def test_what_orjson_refuses_goes_through_the_json_module():
    lone = "a\ud800b"  # a lone surrogate (an error message may quote a client's bad text)
    for value in ({"error": lone}, {"big": 2**70}, {1: "int key"}):
        assert json.loads(json_bytes(value)) == json.loads(json.dumps(value))
    assert json_bytes({"error": lone}).isascii()  # escaped, valid UTF-8
    with pytest.raises(TypeError):
        json_bytes({"x": object()})


@pytest.mark.parametrize(
    "bad", [np.array([0.5, np.nan], np.float32), [1.0, float("inf")], np.float16("-inf")]
)
def test_nan_and_infinities_are_refused_as_the_json_module_refuses_them(bad):
    with pytest.raises(ValueError):
        json.dumps({"v": bad}, allow_nan=False, default=lambda a: a.tolist())
    with pytest.raises(ValueError, match="NaN or an infinity"):
        json_bytes({"data": [{"v": bad}], "none": None})
    assert json_bytes({"none": None, "v": np.zeros(2, np.float32)}) == b'{"none":null,"v":[0.0,0.0]}'


def test_json_response_is_compact_utf8():
    response = json_response(200, {"text": "héllo", "n": [1, 2]})
    assert response.body == '{"text":"héllo","n":[1,2]}'.encode()
    assert response.content_type == "application/json"
