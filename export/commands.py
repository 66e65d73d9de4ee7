"""`bertserve export`: registered into the console script by bertserve/cli.py."""

from __future__ import annotations

import argparse
import sys


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
        "--tolerance", type=float, default=1e-4, help="max |ONNX Runtime - PyTorch| (default 1e-4)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bertserve.export.default_model import DEFAULT_MODEL_NAME, DEFAULT_SOURCE, default_checkpoint_dir
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
        )
    except ExportError as e:
        print(f"bertserve export: error: {e}", file=sys.stderr)
        print("nothing was written", file=sys.stderr)
        return 1
    return 0
