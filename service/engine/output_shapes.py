"""A graph's output shapes resolved from its feeds: each output axis is a number or one of the inputs' named
axes (batch, sequence), as the exported graphs declare them. The simulated device answers in these shapes;
captured runs allocate their output buffers by them."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


class OutputShapes:
    def __init__(self, session: ort.InferenceSession):
        # input name -> its symbolic axes (position -> name)
        self._input_axes = {
            i.name: {axis: d for axis, d in enumerate(i.shape) if isinstance(d, str)}
            for i in session.get_inputs()
        }
        known = {d for axes in self._input_axes.values() for d in axes.values()}
        # in the session's order, which captured runs keep whatever order a batch asks in
        self.outputs = {o.name: (list(o.shape), DTYPES.get(o.type)) for o in session.get_outputs()}
        # outputs whose shape the feeds do not decide (an unnamed or unknown axis) or of another type
        self.unresolved = {
            o.name
            for o in session.get_outputs()
            if o.type not in DTYPES or any(not isinstance(d, int) and d not in known for d in o.shape)
        }

    def shape(self, name: str, feeds: dict[str, np.ndarray]) -> tuple[tuple[int, ...], type]:
        sizes = {
            axis_name: feeds[input_name].shape[axis]
            for input_name, axes in self._input_axes.items()
            if input_name in feeds
            for axis, axis_name in axes.items()
        }
        axes, dtype = self.outputs[name]
        return tuple(d if isinstance(d, int) else sizes[d] for d in axes), dtype
