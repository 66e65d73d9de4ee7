"""sentence-transformers prompts: the text a model's manifest names prepended to each input of an embedding
call (`prompt + text`, as `SentenceTransformer.encode(prompt_name=...)` does), and Cohere's `input_type`
mapped to a prompt name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from bertserve.repository import EmbedTask
from bertserve.service.errors import InvalidInput

if TYPE_CHECKING:
    from bertserve.service.engine.served_model import ServedModel

# Cohere input types and the prompt names sentence-transformers models commonly give them, in order
COHERE_PROMPT_NAMES = {"search_query": ("query",), "search_document": ("document", "passage")}


def _names(prompts: Mapping[str, str]) -> str:
    return ", ".join(sorted(prompts)) if prompts else "none"


def prompt_text(embed: EmbedTask | None, prompt_name: str | None, model: str) -> str:
    """The text to prepend for `prompt_name` (None or "": the model's default prompt, if any; "" when
    none). An unknown name is refused naming the field and the model's prompts."""
    prompts = embed.prompts if embed is not None else {}
    if prompt_name:
        if prompt_name not in prompts:
            raise InvalidInput(
                f"prompt_name: {prompt_name!r} is not one of model {model}'s prompts ({_names(prompts)})"
            )
        return prompts[prompt_name]
    default = embed.default_prompt_name if embed is not None else None
    return prompts.get(default, "") if default else ""


def cohere_prompt_name(
    input_type: str | None, prompts: Mapping[str, str], field: str = "input_type"
) -> str | None:
    """The prompt name for Cohere's `input_type`: a prompt of that very name, else search_query ->
    "query", search_document -> "document" or "passage". None when no input type is given or the model
    has no prompts (it is then ignored); a model with prompts but none that matches is refused."""
    if not input_type or not prompts:
        return None
    if input_type in prompts:
        return input_type
    for name in COHERE_PROMPT_NAMES.get(input_type, ()):
        if name in prompts:
            return name
    raise InvalidInput(f"{field}: {input_type!r} matches none of the model's prompts ({_names(prompts)})")


def call_prompt(model: ServedModel, prompt_name: str | None, embed_only: bool, token_ids: bool) -> str:
    """The prompt text prepended to each text of a call ("" when none): only calls of embedding tasks
    alone take one, and token ids (used as given) never do."""
    if prompt_name and token_ids:
        raise InvalidInput("prompt_name: token_ids are used as given, without a prompt")
    if prompt_name and not embed_only:
        raise InvalidInput("prompt_name: only embedding calls take a prompt")
    if token_ids or not embed_only:
        return ""
    return prompt_text(model.manifest.tasks.embed, prompt_name, model.name)
