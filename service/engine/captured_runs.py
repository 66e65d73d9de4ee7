"""Captured runs: an encoder's batches on fixed buffers, each (shape, outputs) replayed as a CUDA graph.

A plain CUDA run launches every kernel of the graph from the CPU; for a small batch the launches take
longer than the GPU's work. ONNX Runtime's CUDA provider can capture a run as a CUDA graph and replay it
with one launch (provider option `enable_cuda_graph`, one graph per `gpu_graph_id`, captured within the
first run of that id), provided every run of a graph reads and writes the same device buffers. With shape
buckets (service/engine/shapes.py) a server's batches come in a few shapes, so each (shape, outputs) gets
its own buffers, I/O binding and graph id. The warm-up makes them all on the thread that serves, then
freezes the set: a batch asking for another set of outputs runs plain, so nothing is captured while
serving (a capture would disturb CUDA work on other threads). On CPU the same buffers run without graphs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from bertserve.service.engine.output_shapes import OutputShapes


def run_options(graph_id: str | None) -> ort.RunOptions:
    """Options of a run: with `graph_id`, that CUDA graph's (-1: a run that is never captured)."""
    options = ort.RunOptions()
    if graph_id is not None:
        options.add_run_config_entry("gpu_graph_id", graph_id)
    return options


@dataclass
class _Run:
    inputs: dict[str, ort.OrtValue]
    outputs: dict[str, ort.OrtValue]
    binding: ort.IOBinding
    options: ort.RunOptions


class CapturedRuns:
    """Runs of one session on fixed buffers, one set per (input shapes, outputs). Not thread-safe: only an
    encoder of one instance captures (service/engine/model_registry.py), on its one worker thread."""

    def __init__(self, session: ort.InferenceSession, device: str, graphs: bool):
        """`device`: "cuda" or "cpu", where the buffers live; `graphs`: each set replayed as a CUDA graph."""
        self._session = session
        self._device = device
        self._graphs = graphs
        self._shapes = OutputShapes(session)
        self._runs: dict[tuple, _Run] = {}
        self._ids = itertools.count(1)
        self.frozen = False  # no new set once the warm-up is over

    def __len__(self) -> int:
        return len(self._runs)

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray] | None:
        """The outputs, or None where this run has no set and none may be made (frozen, or an output whose
        shape the feeds do not decide): the caller runs it plain."""
        wanted = set(outputs)
        names = tuple(name for name in self._shapes.outputs if name in wanted)  # one order for any batch
        key = (tuple((name, array.shape) for name, array in feeds.items()), names)
        run = self._runs.get(key)
        if run is None:
            if self.frozen or wanted & self._shapes.unresolved:
                return None
            run = self._new(key, feeds, names)
        for name, array in feeds.items():
            run.inputs[name].update_inplace(np.ascontiguousarray(array))
        self._session.run_with_iobinding(run.binding, run.options)
        # a CPU buffer's array is a view that the next run overwrites; a CUDA one's is a fresh copy
        copy = self._device == "cpu"
        return {name: np.array(value.numpy(), copy=copy) for name, value in run.outputs.items()}

    def _new(self, key: tuple, feeds: dict[str, np.ndarray], names: tuple[str, ...]) -> _Run:
        device = self._device
        # copied: on CPU the buffer would otherwise be the caller's own array, overwritten by later runs
        inputs = {name: ort.OrtValue.ortvalue_from_numpy(np.array(a), device, 0) for name, a in feeds.items()}
        answers = {}
        for name in names:
            shape, dtype = self._shapes.shape(name, feeds)
            answers[name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, device, 0)
        binding = self._session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name, value in answers.items():
            binding.bind_ortvalue_output(name, value)
        graph_id = str(next(self._ids)) if self._graphs else None
        self._runs[key] = run = _Run(inputs, answers, binding, run_options(graph_id))
        return run
