"""The engine: what owns the ONNX Runtime sessions and the batchers (`Batcher`, `EncoderGroup`), the served
models and their repository, tokenizers and task heads. It imports only the shared modules of service/."""
