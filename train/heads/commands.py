"""`bertserve train-heads` and `bertserve assemble-heads`: registered into the console script by bertserve/cli.py."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    train = subparsers.add_parser(
        "train-heads",
        help="train the fill-mask and classifier heads of the default model on WordNet (offline, CPU)",
        description=(
            "Train, on WordNet 3.0 nouns (Debian's wordnet-base), a masked-LM head and a noun-category "
            "classifier (pooler + classifier) on the frozen default encoder; measure both on held-out "
            "synsets; write OUT/heads/ (head weights + heads.json with checksums and figures) and "
            "OUT/checkpoints/ (Hugging Face checkpoint directories ready for `bertserve export`)."
        ),
    )
    train.add_argument("--out", metavar="DIR", required=True, help="output directory")
    train.add_argument(
        "--quick", action="store_true", help="every 20th synset, fewer epochs: a check of the pipeline"
    )
    train.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    train.set_defaults(run=run_train)

    assemble = subparsers.add_parser(
        "assemble-heads",
        help="build the fill-mask and classifier checkpoints from the committed heads (no training)",
        description=(
            "Check the committed head weights against their sha256 and write OUT/wordnet-noun-category and "
            "OUT/wordnet-fill-mask: the default encoder's weights + a head, as Hugging Face checkpoints."
        ),
    )
    assemble.add_argument("--out", metavar="DIR", required=True, help="output directory")
    assemble.add_argument(
        "--heads", metavar="DIR", help="heads directory (default: the committed export/heads/weights)"
    )
    assemble.set_defaults(run=run_assemble)


def run_train(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from pathlib import Path

    from bertserve.export.default_model import DEFAULT_SOURCE, default_checkpoint_dir
    from bertserve.export.errors import ExportError
    from bertserve.train.heads.training import FULL_PLAN, QUICK_PLAN, train_heads
    from bertserve.train.heads.wordnet import WordNetMissing

    plan = replace(QUICK_PLAN if args.quick else FULL_PLAN, threads=args.threads)
    try:
        train_heads(
            Path(args.out), default_checkpoint_dir(), DEFAULT_SOURCE, plan, log=lambda s: print(s, flush=True)
        )
    except (ExportError, WordNetMissing) as e:
        print(f"bertserve train-heads: error: {e}", file=sys.stderr)
        return 1
    return 0


def run_assemble(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bertserve.export.default_model import default_checkpoint_dir
    from bertserve.export.errors import ExportError
    from bertserve.export.heads.assemble import COMMITTED_HEADS_DIR, assemble_checkpoints

    try:
        written = assemble_checkpoints(
            default_checkpoint_dir(), Path(args.out), Path(args.heads) if args.heads else COMMITTED_HEADS_DIR
        )
    except ExportError as e:
        print(f"bertserve assemble-heads: error: {e}", file=sys.stderr)
        return 1
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0
