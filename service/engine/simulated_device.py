"""A simulated device (setting `simulated_device_ms`): encoder graphs that answer without computing.

Each run returns the graph's own outputs (names, dtypes, and shapes resolved from the inputs' sizes, read
from the loaded ONNX session) after a wall time spent in `time.sleep`, which releases the GIL and costs no
CPU: what a GPU's batch looks like to the server. The time is fixed per batch, plus
`simulated_device_us_per_token` per padded token where set (a GPU's batch grows with its padded shape).
So the server's capacity beside its device (the fronts, the batcher, tokenization, replies) can be
measured on any machine. The real session stays loaded (the repository's checks and the graph's metadata
hold as for a real run) but is never run.

Values are constant (1 / the output's last axis): embeddings normalize without NaN, attention rows sum to
1, and a real head fed these hidden states computes real logits.
"""

from __future__ import annotations

import time

import numpy as np

from bertserve.service.engine.output_shapes import OutputShapes
from bertserve.service.engine.runtime import GraphSession
from bertserve.service.errors import StartupError

SIMULATED = "simulated"  # the provider a simulated session reports (Info, bertserve_model_info, logs)


class SimulatedSession:
    """A `GraphSession` stand-in: same inputs and outputs, `run` sleeps `milliseconds` (plus
    `us_per_token` per padded token of its input_ids) then answers."""

    provider = SIMULATED

    def __init__(self, real: GraphSession, milliseconds: float, where: str = "", us_per_token: float = 0.0):
        self.real = real  # loaded, never run
        self.seconds = milliseconds / 1e3
        self.token_seconds = us_per_token / 1e6
        self.providers = [SIMULATED]
        self.device = real.device  # only decides whether instances share one session
        self.io_binding = False
        self.input_names = real.input_names
        self.output_names = real.output_names
        self._shapes = OutputShapes(real.session)
        for output in real.session.get_outputs():
            if output.name in self._shapes.unresolved:
                raise StartupError(
                    f"{where or 'a graph'}: output {output.name} ({output.type} {output.shape}) cannot be "
                    "simulated: each axis must be a number or one of the inputs' named axes"
                )

    def set_constant_inputs(self, feeds: dict[str, np.ndarray]) -> None:
        """Accepted and unused: a simulated graph reads no input's values."""

    def run(
        self, feeds: dict[str, np.ndarray], outputs: list[str], captured: bool = False
    ) -> dict[str, np.ndarray]:
        """Blocking for the batch's simulated time from the call (the outputs are built within it): call it
        from a worker thread, as a real session's run."""
        ids = feeds.get("input_ids")
        padded = ids.size if ids is not None else 0
        deadline = time.perf_counter() + self.seconds + self.token_seconds * padded
        answers = {}
        for name in outputs:
            shape, dtype = self._shapes.shape(name, feeds)
            fill = 1.0 / shape[-1] if shape and shape[-1] and np.issubdtype(dtype, np.floating) else 0
            answers[name] = np.full(shape, fill, dtype=dtype)
        remaining = deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return answers
