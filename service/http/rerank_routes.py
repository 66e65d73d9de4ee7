"""Reranking and pair scoring in the shapes other servers' clients send; each route is one call of the
inference core (`InferenceCore.rerank` / `.score`), the same as gRPC Rerank and Score.

    POST /v1/rerank  Jina's (and vLLM's): {query, documents: [string | {"text"}], model?, top_n?,
                     return_documents? (default true), truncate_prompt_tokens?}
                     -> {id, model, usage, results: [{index, relevance_score, document?: {text}}]}
    POST /v2/rerank  Cohere v2's (the `cohere` SDK's ClientV2.rerank): {model, query, documents, top_n?,
                     max_tokens_per_doc?, return_documents? (default false), priority? (ignored),
                     relevant_spans? (mode "disabled" only)} -> {id, results, meta}
    POST /rerank     TEI's: {query, texts, raw_scores?, return_text?, truncate?, truncation_direction?
                     ("right" only)} -> [{index, score, text?}]
    POST /v1/score   vLLM's: {text_1, text_2 (a string or strings each: 1 x N or N x N), model?,
                     truncate_prompt_tokens?} -> {id, object, created, model, data: [{index, object, score}], usage}

Results are best first (ties: the lower index). `model` absent: the first loaded cross-encoder, else the
default embedding model (cosine); a named model must be loaded (404 otherwise). Rerank documents are cut to
fit max_length with the query unless TEI's `truncate` is false; a client's own token limit
(`truncate_prompt_tokens`, `max_tokens_per_doc`) is accepted when it is at least the model's max_length
(-1 too for vLLM's): the pair is cut to max_length. Score cuts pairs only when `truncate_prompt_tokens` is set.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from bertserve.service.errors import InvalidInput, quote
from bertserve.service.http.json_body import off_loop_above
from bertserve.service.http.pair_fields import (
    PAIR_TEXTS,
    check_token_limit,
    documents,
    renamed,
    texts,
    top_n,
)
from bertserve.service.http.routing import Call, Route
from bertserve.service.http.schema import Fields, json_object, kind_of
from bertserve.service.http.transport import Response, json_response

if TYPE_CHECKING:
    from bertserve.service.core.results import RerankResult, ScoreResult
    from bertserve.service.http.app import HttpFront

# A result entry without its document, in JSON: to decide which replies are built off the loop.
JSON_RESULT_BYTES = 80


def _reply_size(result: RerankResult) -> int:
    return sum(JSON_RESULT_BYTES + 6 * len(r.document or "") for r in result.results)


def _usage(tokens: int) -> dict:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def _ranked(result: RerankResult, score: str, document: bool) -> list[dict]:
    """The results best first: index, the score under `score`, the text as {"text": ...} (`document`) or
    as "text" (TEI's) when returned."""
    entries = []
    for r in result.results:
        entry = {"index": r.index, score: float(r.score)}
        if r.document is not None:
            entry.update({"document": {"text": r.document}} if document else {"text": r.document})
        entries.append(entry)
    return entries


def _prompt_tokens(fields: Fields) -> int | None:
    """vLLM's truncate_prompt_tokens: None (absent), -1 (max_length) or a count of at least 1."""
    tokens = fields.integer("truncate_prompt_tokens")
    if tokens is not None and tokens != -1 and tokens < 1:
        raise InvalidInput(f"truncate_prompt_tokens: must be -1 (max_length) or at least 1 (got {tokens})")
    return tokens


def _jina_reply(result: RerankResult) -> Response:
    body = {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": result.meta.model,
        "usage": _usage(result.meta.total_tokens),
        "results": _ranked(result, "relevance_score", document=True),
    }
    return json_response(200, body)


async def rerank_v1(front: HttpFront, call: Call) -> Response:
    body = await json_object(front, call.request, PAIR_TEXTS)
    allowed = ("model", "query", "documents", "top_n", "return_documents", "truncate_prompt_tokens", "user")
    fields = Fields(body, allowed)
    model, query = fields.string("model"), fields.required_string("query")
    docs = documents(front, body, "documents")
    count, return_documents = top_n(fields), fields.boolean("return_documents", True)
    tokens = _prompt_tokens(fields)
    check_token_limit(front, model, tokens, "truncate_prompt_tokens")
    result = await front.core.rerank(
        model, query, docs, top_n=count, return_documents=return_documents, deadline=call.deadline
    )  # truncate_prompt_tokens cuts documents, as Rerank always does
    return await off_loop_above(front, _reply_size(result), _jina_reply, result)


def _cohere_reply(result: RerankResult) -> Response:
    results = _ranked(result, "relevance_score", document=True)
    meta = {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}
    return json_response(200, {"id": str(uuid.uuid4()), "results": results, "meta": meta})


def _relevant_spans(value: object) -> None:
    if value is None:
        return
    mode = value.get("mode") if isinstance(value, dict) else None
    if mode != "disabled":
        shown = quote(mode, 32) if isinstance(value, dict) else kind_of(value)
        raise InvalidInput(
            f"relevant_spans: not supported; leave it out or send mode 'disabled' (got {shown})"
        )


async def rerank_v2(front: HttpFront, call: Call) -> Response:
    body = await json_object(front, call.request, PAIR_TEXTS)
    allowed = (
        "model",
        "query",
        "documents",
        "top_n",
        "max_tokens_per_doc",
        "return_documents",
        "priority",
        "relevant_spans",
    )
    fields = Fields(body, allowed)
    model, query = fields.string("model"), fields.required_string("query")
    docs = documents(front, body, "documents")
    count, return_documents = top_n(fields), fields.boolean("return_documents")
    fields.integer("priority")  # scheduling hint of Cohere's: accepted, not used
    _relevant_spans(body.get("relevant_spans"))
    per_doc = fields.integer("max_tokens_per_doc")
    if per_doc is not None and per_doc < 1:
        raise InvalidInput(f"max_tokens_per_doc: must be at least 1 (got {per_doc})")
    check_token_limit(front, model, per_doc, "max_tokens_per_doc")
    result = await front.core.rerank(
        model, query, docs, top_n=count, return_documents=return_documents, deadline=call.deadline
    )
    return await off_loop_above(front, _reply_size(result), _cohere_reply, result)


def _tei_reply(result: RerankResult) -> Response:
    return json_response(200, _ranked(result, "score", document=False))


async def rerank_tei(front: HttpFront, call: Call) -> Response:
    body = await json_object(front, call.request, PAIR_TEXTS)
    allowed = ("query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction")
    fields = Fields(body, allowed)
    query = fields.required_string("query")
    docs = documents(front, body, "texts", objects=False)
    direction = fields.string("truncation_direction", "right")
    if direction.lower() != "right":
        raise InvalidInput(
            "truncation_direction: only 'right' is supported (documents are cut at their end; "
            f"got {direction[:32]!r})"
        )
    truncate = fields.boolean("truncate", None)
    options = {} if truncate is None else {"truncate": truncate}
    with renamed({"documents": "texts"}):
        result = await front.core.rerank(
            "",
            query,
            docs,
            return_documents=fields.boolean("return_text"),
            raw_scores=fields.boolean("raw_scores"),
            deadline=call.deadline,
            **options,
        )
    return await off_loop_above(front, _reply_size(result), _tei_reply, result)


def _score_reply(result: ScoreResult) -> Response:
    tokens = result.meta.total_tokens
    body = {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": result.meta.model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(result.scores.tolist())],
        "usage": {**_usage(tokens), "completion_tokens": 0},
    }
    return json_response(200, body)


async def score_v1(front: HttpFront, call: Call) -> Response:
    body = await json_object(front, call.request, PAIR_TEXTS)
    fields = Fields(body, ("model", "text_1", "text_2", "truncate_prompt_tokens", "user"))
    model = fields.string("model")
    first, second = texts(front, body, "text_1"), texts(front, body, "text_2")
    tokens = _prompt_tokens(fields)
    check_token_limit(front, model, tokens, "truncate_prompt_tokens")
    truncate = tokens is not None
    with renamed({"texts_1": "text_1", "texts_2": "text_2"}):
        result = await front.core.score(model, first, second, truncate=truncate, deadline=call.deadline)
    return await off_loop_above(front, JSON_RESULT_BYTES * len(result.scores), _score_reply, result)


ROUTES = [
    Route("POST", "/v1/rerank", rerank_v1, summary="Rerank documents (Jina's and vLLM's shape)"),
    Route("POST", "/v2/rerank", rerank_v2, summary="Rerank documents (Cohere v2's shape)"),
    Route("POST", "/rerank", rerank_tei, summary="Rerank texts (text-embeddings-inference's shape)"),
    Route("POST", "/v1/score", score_v1, summary="Score sentence pairs (vLLM's shape)"),
]
