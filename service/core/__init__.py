"""The protocol-free inference core the fronts call (`InferenceCore`): validation, tokenization, reply
building, server info and the lifecycle the drain waits on. It imports the engine and the shared modules."""
