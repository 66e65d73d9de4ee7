"""HTTP beside gRPC, on the same event loop and through the same inference core (`service/core/core.py`):
OpenAI-compatible embeddings, bertserve.v1 over JSON, KServe v2 REST, probes and an OpenAPI document.

`transport.py` is the HTTP/1.1 server (httptools) with its limits; `app.py` routes and wraps every call
(draining, timeouts, metrics); `status.py` maps errors to status codes in one place; the route modules
translate JSON <-> core calls.
"""
