"""Process wiring: `InferenceServer` assembles the engine, the core and every front (gRPC, HTTP, KServe);
`serve` runs it. It may import anything in service/."""
