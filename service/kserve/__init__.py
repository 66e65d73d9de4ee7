"""KServe v2 / Open Inference Protocol (`inference.GRPCInferenceService`): the proto's generated code
(`open_inference_pb2*.py`, from protos/bertserve/kserve/) and its servicer, which reuses bertserve.v1's
inference path."""
