"""Generated protobuf/gRPC code for bertserve.v1 (run `python -m bertserve.protogen`; never edit by hand)."""
