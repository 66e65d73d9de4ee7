"""The OpenAPI 3.1 document of the HTTP routes (served at /openapi.json), built from the route tables and
the request schemas below, so a route cannot be missing from it."""

from __future__ import annotations

from bertserve import __version__
from bertserve.service.http.openapi_embed import embed_schemas
from bertserve.service.http.routing import TIMEOUT_HEADER, Route

STRING_OR_STRINGS = {
    "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]
}
STRINGS = {"type": "array", "items": {"type": "string"}, "minItems": 1}
MODEL = {"type": "string", "description": "a served model; absent: the default model for the task"}
TRUNCATE = {"type": "boolean", "default": False, "description": "cut inputs longer than max_length"}
TOP_K = {"type": "integer", "minimum": 1}
INDICES = {"type": "array", "items": {"type": "integer", "minimum": 0}}
TOP_N = {"type": "integer", "minimum": 1, "description": "the best top_n results; absent: every document"}
DOCUMENTS = {
    "type": "array",
    "minItems": 1,
    "items": {
        "oneOf": [
            {"type": "string"},
            {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
        ]
    },
}
TOKEN_LIMIT = {
    "type": "integer",
    "description": "accepted when at least the model's max_length (pairs are cut to max_length)",
}
STRATEGY = {"enum": ["longest_first", "only_first", "only_second"], "default": "longest_first"}


def _object(required: list[str], **properties) -> dict:
    return {"type": "object", "required": required, "additionalProperties": False, "properties": properties}


REQUEST_SCHEMAS = {
    **embed_schemas(_object, STRINGS, MODEL, TRUNCATE, TOKEN_LIMIT),
    "/bertserve/v1/fill-mask": _object(
        ["inputs"], inputs=STRINGS, model=MODEL, top_k=TOP_K, truncate=TRUNCATE
    ),
    "/bertserve/v1/classify": _object(
        ["inputs"],
        inputs=STRINGS,
        model=MODEL,
        top_k=TOP_K,
        raw_scores={"type": "boolean"},
        truncate=TRUNCATE,
        pairs={**STRINGS, "description": "the second text of each input (sentence pairs)"},
        truncation_strategy=STRATEGY,
    ),
    "/bertserve/v1/rerank": _object(
        ["query", "documents"],
        query={"type": "string"},
        documents=STRINGS,
        model=MODEL,
        top_n=TOP_N,
        return_documents={"type": "boolean", "default": False},
        raw_scores={"type": "boolean"},
        truncate={"type": "boolean", "default": True},
    ),
    "/bertserve/v1/score": _object(
        ["texts_1", "texts_2"],
        texts_1={**STRINGS, "description": "one text (scored against every texts_2) or as many as texts_2"},
        texts_2=STRINGS,
        model=MODEL,
        raw_scores={"type": "boolean"},
        truncate=TRUNCATE,
        truncation_strategy=STRATEGY,
    ),
    "/v1/rerank": _object(
        ["query", "documents"],
        query={"type": "string"},
        documents=DOCUMENTS,
        model=MODEL,
        top_n=TOP_N,
        return_documents={"type": "boolean", "default": True},
        truncate_prompt_tokens={**TOKEN_LIMIT, "description": "-1, or at least the model's max_length"},
        user={"type": "string", "description": "ignored"},
    ),
    "/v2/rerank": _object(
        ["query", "documents"],
        query={"type": "string"},
        documents=DOCUMENTS,
        model=MODEL,
        top_n=TOP_N,
        max_tokens_per_doc=TOKEN_LIMIT,
        return_documents={"type": "boolean", "default": False},
        priority={"type": "integer", "description": "ignored"},
        relevant_spans={"type": "object", "description": 'only {"mode": "disabled"}'},
    ),
    "/rerank": _object(
        ["query", "texts"],
        query={"type": "string"},
        texts=STRINGS,
        raw_scores={"type": "boolean", "default": False},
        return_text={"type": "boolean", "default": False},
        truncate={"type": "boolean", "default": True},
        truncation_direction={"enum": ["right", "Right"], "default": "right"},
    ),
    "/v1/score": _object(
        ["text_1", "text_2"],
        text_1=STRING_OR_STRINGS,
        text_2=STRING_OR_STRINGS,
        model=MODEL,
        truncate_prompt_tokens={**TOKEN_LIMIT, "description": "-1, or at least the model's max_length"},
        user={"type": "string", "description": "ignored"},
    ),
    "/bertserve/v1/tokenize": _object(["inputs"], inputs=STRINGS, model=MODEL, truncate=TRUNCATE),
    "/bertserve/v1/attention": _object(
        ["input"], input={"type": "string"}, model=MODEL, layers=INDICES, heads=INDICES, truncate=TRUNCATE
    ),
    "/bertserve/v1/info": _object([]),
}
KSERVE_INFER = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {
            "type": "object",
            "description": "normalize, truncate, top_k, raw_scores, truncation_strategy, binary_data_output",
        },
        "inputs": {
            "type": "array",
            "description": 'one tensor {"name": "text", "datatype": "BYTES", "shape": [n], "data": [...]}, '
            'and for classify outputs optionally a second "text_pair" of the same shape (sentence pairs)',
            "items": {"type": "object"},
        },
        "outputs": {"type": "array", "items": {"type": "object"}},
    },
}
ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "param": {"type": ["string", "null"]},
                        "code": {"type": "string", "description": "the gRPC status name"},
                    },
                },
                {"type": "string", "description": "KServe v2 routes"},
            ]
        }
    },
}
ERROR_STATUSES = {
    "400": "invalid argument (the message names the field and the limit)",
    "404": "unknown model or route",
    "413": "request body over max_message_bytes",
    "415": "unsupported content type",
    "422": "the model lacks the task (FAILED_PRECONDITION)",
    "429": "queue full; retry after Retry-After seconds",
    "503": "draining; retry elsewhere",
    "504": f"the {TIMEOUT_HEADER} deadline passed",
}


def _operation(route: Route) -> dict:
    operation: dict = {
        "summary": route.summary,
        "operationId": f"{route.method.lower()}{route.template.replace('/', '_').replace('{', '').replace('}', '')}",
        "parameters": [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in route.pattern.groupindex
        ],
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
            **{
                status: {"description": text, "content": {"application/json": {"schema": ERROR}}}
                for status, text in ERROR_STATUSES.items()
            },
        },
    }
    if route.admitted:
        operation["parameters"].append(
            {
                "name": TIMEOUT_HEADER,
                "in": "header",
                "required": False,
                "schema": {"type": "number", "exclusiveMinimum": 0},
                "description": "the call's deadline in seconds; 504 when it passes",
            }
        )
    schema = KSERVE_INFER if route.template.endswith("/infer") else REQUEST_SCHEMAS.get(route.template)
    if route.method == "POST" and schema is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    return operation


def document(routes: list[Route]) -> dict:
    paths: dict[str, dict] = {}
    for route in routes:
        paths.setdefault(route.template, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "bertserve HTTP API",
            "version": __version__,
            "description": "OpenAI-compatible embeddings; embeddings in TEI's and Cohere's shapes; rerank and score in Jina's, Cohere's, TEI's and "
            "vLLM's shapes; bertserve.v1 over JSON, KServe v2 REST, probes. "
            "Errors: status codes as in docs/architecture.md (HTTP).",
        },
        "paths": paths,
    }
