"""Generated protobuf/gRPC code for KServe v2 / Open Inference Protocol (never edited by hand)."""
