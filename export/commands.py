"""`bertserve export` and `bertserve export-default-heads`: registered into the console script by bertserve/cli.py."""

from __future__ import annotations

import argparse
import sys

from bertserve.command_table import describe


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a Hugging Face BERT checkpoint to a verified ONNX model repository",
        description=(
            "Load a BERT checkpoint into the scratch PyTorch encoder, trace it to ONNX, verify ONNX Runtime "
            "against PyTorch over a grid of shapes, fuse with ONNX Runtime's optimizer, and write "
            "REPO/NAME/VERSION with a manifest. Nothing is written when a check fails (exit 1)."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--checkpoint", metavar="DIR", help="Hugging Face checkpoint directory (config.json + weights)"
    )
    source.add_argument(
        "--default",
        action="store_true",
        help="the default model, all-MiniLM-L6-v2 (bundled package); implies --int8 --fp16",
    )
    parser.add_argument("--out", metavar="REPO", required=True, help="model repository directory")
    parser.add_argument(
        "--name", help="model name in the repository (default: from the checkpoint directory)"
    )
    parser.add_argument("--version", type=int, help="version number (default: the next free one)")
    parser.add_argument(
        "--int8", action="store_true", help="also an int8 encoder (gated: cosine to fp32 >= 0.99)"
    )
    parser.add_argument(
        "--fp16", action="store_true", help="also a float16 encoder with float32 inputs/outputs"
    )
    parser.add_argument(
        "--attentions", action="store_true", help="also an unfused encoder that outputs attentions"
    )
    parser.add_argument(
        "--encoder",
        metavar="NAME[:VERSION]",
        help=(
            "write a head-only model that runs on this encoder model of REPO (default: its highest version), "
            "after checking that it computes the checkpoint's encoder; no encoder graphs are copied"
        ),
    )
    parser.add_argument(
        "--pairs",
        action="store_true",
        help=(
            "the checkpoint is a sequence classifier trained on sentence pairs (recorded in the manifest; "
            "a sentence-transformers CrossEncoder is recognised without it)"
        ),
    )
    parser.add_argument(
        "--dimensions",
        metavar="D1,D2,...",
        help=(
            "the Matryoshka sizes embeddings may be cut to (each below the hidden size), instead of the "
            "checkpoint's config_sentence_transformers.json `matryoshka_dimensions`"
        ),
    )
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="max |ONNX Runtime - PyTorch| (default 1e-4)"
    )
    parser.set_defaults(run=run)

    heads = subparsers.add_parser(
        "export-default-heads",
        help=describe("export-default-heads"),
        description=(
            "Export the default models beside the encoder (after `bertserve export --default`, into the same "
            "REPO): wordnet-noun-category, head-only on all-minilm-l6-v2, and wordnet-fill-mask, MiniLM with "
            "the committed masked-LM pretraining (a model of its own; its manifest lists the modules it shares "
            "with MiniLM). A model REPO already has a version of is left as it is."
        ),
    )
    heads.add_argument("--out", metavar="REPO", required=True, help="model repository directory")
    heads.add_argument(
        "--fill-mask-from-heads",
        action="store_true",
        help="fill-mask as the earlier WordNet MLM head on the frozen encoder (head-only, weaker answers)",
    )
    heads.set_defaults(run=run_default_heads)


def run(args: argparse.Namespace) -> int:
    from bertserve.export.default_model import DEFAULT_MODEL_NAME, DEFAULT_SOURCE, default_checkpoint_dir
    from bertserve.export.embedding_options import parse_dimensions
    from bertserve.export.errors import ExportError
    from bertserve.export.pipeline import export_model

    try:
        if args.default:
            checkpoint, name, source = (
                default_checkpoint_dir(),
                args.name or DEFAULT_MODEL_NAME,
                DEFAULT_SOURCE,
            )
        else:
            checkpoint, name, source = args.checkpoint, args.name, None
        dimensions = parse_dimensions(args.dimensions) if args.dimensions is not None else None
        export_model(
            checkpoint,
            args.out,
            name=name,
            version=args.version,
            int8=args.int8 or args.default,
            fp16=args.fp16 or args.default,
            attentions=args.attentions,
            tolerance=args.tolerance,
            log=lambda line: print(line, flush=True),
            source=source,
            encoder=args.encoder,
            pairs=args.pairs,
            dimensions=dimensions,
        )
    except ExportError as e:
        print(f"bertserve export: error: {e}", file=sys.stderr)
        print("nothing was written", file=sys.stderr)
        return 1
    return 0


def run_default_heads(args: argparse.Namespace) -> int:
    from bertserve.export.default_heads import export_default_heads
    from bertserve.export.errors import ExportError

    try:
        export_default_heads(args.out, args.fill_mask_from_heads, log=lambda line: print(line, flush=True))
    except (ExportError, OSError) as e:
        print(f"bertserve export-default-heads: error: {e}", file=sys.stderr)
        return 1
    return 0
