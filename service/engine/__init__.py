"""The engine: the ONNX Runtime sessions and the batchers (one queue owner per encoder)."""
