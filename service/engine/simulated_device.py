"""A simulated device (setting `simulated_device_ms`): encoder graphs that answer without computing.

Each run returns the graph's own outputs (names, dtypes, and shapes resolved from the inputs' sizes, read
from the loaded ONNX session) after a fixed wall time spent in `time.sleep`, which releases the GIL and
costs no CPU: what a GPU's batch looks like to the server. So the server's capacity beside its device (the
fronts, the batcher, tokenization, replies) can be measured on any machine. The real session stays loaded
(the repository's checks and the graph's metadata hold as for a real run) but is never run.

Values are constant (1 / the output's last axis): embeddings normalize without NaN, attention rows sum to
1, and a real head fed these hidden states computes real logits.
"""

from __future__ import annotations

import time

import numpy as np

from bertserve.service.engine.runtime import GraphSession
from bertserve.service.errors import StartupError

SIMULATED = "simulated"  # the provider a simulated session reports (Info, bertserve_model_info, logs)
_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


class SimulatedSession:
    """A `GraphSession` stand-in: same inputs and outputs, `run` sleeps `milliseconds` then answers."""

    provider = SIMULATED

    def __init__(self, real: GraphSession, milliseconds: float, where: str = ""):
        self.real = real  # loaded, never run
        self.seconds = milliseconds / 1e3
        self.providers = [SIMULATED]
        self.device = real.device  # only decides whether instances share one session
        self.io_binding = False
        self.input_names = real.input_names
        self.output_names = real.output_names
        # input name -> its symbolic axes (position -> name), so an output's axes resolve from the feeds
        self._input_axes = {
            i.name: {axis: d for axis, d in enumerate(i.shape) if isinstance(d, str)}
            for i in real.session.get_inputs()
        }
        known = {d for axes in self._input_axes.values() for d in axes.values()}
        self._outputs: dict[str, tuple[list[int | str], type]] = {}
        for output in real.session.get_outputs():
            unknown = [d for d in output.shape if not isinstance(d, int) and d not in known]
            if unknown or output.type not in _DTYPES:
                raise StartupError(
                    f"{where or 'a graph'}: output {output.name} ({output.type} {output.shape}) cannot be "
                    "simulated: each axis must be a number or one of the inputs' named axes"
                )
            self._outputs[output.name] = (list(output.shape), _DTYPES[output.type])

    def set_constant_inputs(self, feeds: dict[str, np.ndarray]) -> None:
        """Accepted and unused: a simulated graph reads no input's values."""

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Blocking for `milliseconds` from the call (the outputs are built within it): call it from a worker
        thread, as a real session's run."""
        deadline = time.perf_counter() + self.seconds
        sizes = {
            name: feeds[input_name].shape[axis]
            for input_name, axes in self._input_axes.items()
            if input_name in feeds
            for axis, name in axes.items()
        }
        answers = {}
        for name in outputs:
            axes, dtype = self._outputs[name]
            shape = tuple(d if isinstance(d, int) else sizes[d] for d in axes)
            fill = 1.0 / shape[-1] if shape and shape[-1] and np.issubdtype(dtype, np.floating) else 0
            answers[name] = np.full(shape, fill, dtype=dtype)
        remaining = deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return answers
