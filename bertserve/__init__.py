"""bertserve: gRPC inference for BERT-family encoders on ONNX Runtime.

This package holds only what both sides share (the manifest schema, the CLI entry point and the
generated protobuf code); it imports neither torch nor transformers.
"""

__version__ = "0.1.0"
