"""The gRPC front: bertserve.v1's servicer and streams, status mapping, admission and health. It imports
the core and the shared modules, never another front (`import grpc` here is grpcio: imports are absolute)."""
