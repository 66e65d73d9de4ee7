"""The OpenAPI request schemas of the embedding routes (bertserve.v1 /embed, OpenAI /v1/embeddings, TEI
/embed, /embed_all, /embed_sparse, Cohere /v2/embed); openapi.py merges them into its document."""

from __future__ import annotations

from collections.abc import Callable


def embed_schemas(
    object_: Callable[..., dict], strings: dict, model: dict, truncate: dict, token_limit: dict
) -> dict[str, dict]:
    """The schemas by route, built with openapi.py's object helper and shared field schemas."""
    token_ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    texts_or_ids = {
        "oneOf": [
            {"type": "string"},
            strings,
            {**token_ids, "description": "one input as the model's token ids (used as given)"},
            {"type": "array", "items": token_ids, "minItems": 1},
        ]
    }
    dimensions = {
        "type": "integer",
        "minimum": 1,
        "description": "one of the model's dimensions (Info), or its own",
    }
    prompt_name = {
        "type": "string",
        "description": "the model's prompt of this name; absent: its default prompt",
    }
    direction = {
        "enum": ["right", "left", "Right", "Left"],
        "default": "right",
        "description": "which end is cut",
    }
    encodings = {
        "type": "array",
        "minItems": 1,
        "uniqueItems": True,
        "items": {"enum": ["float", "float16", "int8", "uint8", "binary", "ubinary"]},
        "default": ["float"],
    }
    chunking = {
        "type": "object",
        "additionalProperties": False,
        "description": "long inputs embedded window by window and pooled (dense only)",
        "properties": {
            "length": {"type": "integer", "minimum": 0, "description": "tokens per window; 0: max_length"},
            "overlap": {"type": "integer", "minimum": 0},
            "pooling": {"enum": ["mean", "max"], "default": "mean"},
        },
    }
    sparse_threshold = {"type": "number", "default": 0, "description": "weights at or below it are left out"}
    return {
        "/v1/embeddings": object_(
            ["input"],
            input=texts_or_ids,
            model=model,
            encoding_format={"enum": ["float", "base64"], "default": "float"},
            dimensions=dimensions,
            user={"type": "string", "description": "ignored"},
            truncate=truncate,
        ),
        "/bertserve/v1/embed": object_(
            [],
            inputs=strings,
            token_ids={
                "type": "array",
                "items": token_ids,
                "minItems": 1,
                "description": "instead of inputs",
            },
            model=model,
            normalize={"type": "boolean"},
            truncate=truncate,
            dimensions=dimensions,
            prompt_name=prompt_name,
            truncation_direction=direction,
            encodings=encodings,
            dense={"type": "boolean", "description": "the pooled vector; absent: unless tokens or sparse"},
            tokens={"type": "boolean", "default": False, "description": "token-level vectors"},
            sparse={
                "type": "boolean",
                "default": False,
                "description": "SPLADE weights (a model with an MLM head)",
            },
            sparse_threshold=sparse_threshold,
            chunking=chunking,
        ),
        "/embed": object_(
            ["inputs"],
            inputs=texts_or_ids,
            normalize={"type": "boolean", "default": True},
            truncate=truncate,
            truncation_direction=direction,
            prompt_name=prompt_name,
            dimensions=dimensions,
            model=model,
        ),
        "/embed_all": object_(
            ["inputs"],
            inputs=texts_or_ids,
            truncate=truncate,
            truncation_direction=direction,
            prompt_name=prompt_name,
            model=model,
        ),
        "/embed_sparse": object_(
            ["inputs"],
            inputs=texts_or_ids,
            truncate=truncate,
            truncation_direction=direction,
            prompt_name=prompt_name,
            model={
                **model,
                "description": "absent: the default embedding model, else the first with an MLM head",
            },
            sparse_threshold=sparse_threshold,
        ),
        "/v2/embed": object_(
            ["texts"],
            texts=strings,
            model=model,
            input_type={"type": "string", "description": "search_query, search_document or a prompt's name"},
            embedding_types={
                "type": "array",
                "minItems": 1,
                "uniqueItems": True,
                "items": {"enum": ["float", "int8", "uint8", "binary", "ubinary", "base64"]},
                "default": ["float"],
            },
            truncate={"enum": ["NONE", "START", "END"], "default": "END"},
            output_dimension=dimensions,
            max_tokens={**token_limit, "description": "accepted when at least the model's max_length"},
            priority={"type": "integer", "description": "ignored"},
        ),
    }
