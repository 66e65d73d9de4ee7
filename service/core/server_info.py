"""What Info reports, as the core's typed results: each model's facts, the limits, library versions."""

from __future__ import annotations

from importlib.metadata import version as package_version

import onnxruntime
import tokenizers

from bertserve.service.core.embed_options import offered_encodings
from bertserve.service.core.results import Limits, ModelInfo
from bertserve.service.engine.served_model import ServedModel
from bertserve.service.settings import Settings


def model_info_of(model: ServedModel, default_for: list[str]) -> ModelInfo:
    manifest, tasks, dims = model.manifest, model.manifest.tasks, model.manifest.dimensions
    return ModelInfo(
        name=model.name,
        version=model.version,
        encoder=model.encoder.name,
        tasks=[t.value for t in model.tasks] + (["attention"] if model.attention else []),
        default_for=default_for,
        dimension=tasks.embed.dimension if tasks.embed else dims.hidden_size,
        max_length=manifest.max_length,
        vocab_size=dims.vocab_size,
        num_layers=dims.num_hidden_layers,
        num_heads=dims.num_attention_heads,
        precision=model.precision,
        provider=model.provider,
        pooling=tasks.embed.pooling if tasks.embed else "",
        normalize_default=bool(tasks.embed and tasks.embed.normalize),
        mask_token=tasks.fill_mask.mask_token if tasks.fill_mask else "",
        labels=[tasks.classify.id2label[i] for i in sorted(tasks.classify.id2label)]
        if tasks.classify
        else [],
        problem_type=tasks.classify.problem_type if tasks.classify else "",
        pairs=bool(tasks.classify and tasks.classify.pairs),
        cross_encoder=model.cross_encoder,
        cosine_of=fusion.embedding_model if (fusion := model.fusion) else "",
        dimensions=sorted(set(tasks.embed.dimensions)) if tasks.embed else [],
        prompts=dict(tasks.embed.prompts) if tasks.embed else {},
        default_prompt_name=(tasks.embed.default_prompt_name or "") if tasks.embed else "",
        encodings=offered_encodings(tasks.embed),
        sparse=bool(tasks.embed and tasks.fill_mask),
    )


def limits_of(s: Settings) -> Limits:
    return Limits(
        max_inputs_per_request=s.max_inputs_per_request,
        max_input_chars=s.max_input_chars,
        max_message_bytes=s.max_message_bytes,
        max_batch_size=s.max_batch_size,
        max_batch_tokens=s.max_batch_tokens,
        max_queue_inputs=s.max_queue_inputs,
        max_queue_attention=s.max_queue_attention,
        max_queue_delay_ms=s.max_queue_delay_ms,
        max_masks_per_input=s.max_masks_per_input,
        max_padding_ratio=s.max_padding_ratio,
    )


def library_versions() -> dict[str, str]:
    return {
        "onnxruntime": onnxruntime.__version__,
        "tokenizers": tokenizers.__version__,
        "grpcio": package_version("grpcio"),
        "protobuf": package_version("protobuf"),
    }
