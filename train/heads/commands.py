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
    register_reranker(subparsers)


def register_reranker(subparsers) -> None:
    train = subparsers.add_parser(
        "train-reranker",
        help="train the default cross-encoder reranker on WordNet (offline, CPU)",
        description=(
            "Train, on WordNet 3.0 nouns, a cross-encoder on the default encoder (its top layers, pooler and a "
            "one-logit classifier; the lower layers frozen, their outputs cached in OUT/cache); measure it, "
            "its head-only variant (not with --large), BM25 and the encoder's cosine on held-out synsets over "
            "the same candidate lists; fit the sum of its logit and the cosine on training-split lists and "
            "measure it too; write OUT/weights (reranker.safetensors + reranker.json) and OUT/checkpoint."
        ),
    )
    train.add_argument("--out", metavar="DIR", required=True, help="output directory")
    size = train.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_true", help="a few lists, top layer only, one epoch: a check of the pipeline"
    )
    size.add_argument(
        "--large",
        action="store_true",
        help="18,000 lists, the top 4 layers trained, one epoch (74 minutes measured on 2 cores)",
    )
    train.add_argument(
        "--layers",
        metavar="K[,K...]",
        help="trained top layers of each variant measured, the last one written (default 0,1: head only, then 1)",
    )
    train.add_argument(
        "--fit-fusion",
        action="store_true",
        help="no training: fit again the fusion of OUT/weights' cross-encoder with the cosine, and record it",
    )
    train.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    train.set_defaults(run=run_train_reranker)

    assemble = subparsers.add_parser(
        "assemble-reranker",
        help="build the reranker checkpoint from the committed weights (no training)",
        description=(
            "Check the committed reranker weights against their sha256 and write OUT: the default encoder + "
            "the trained tensors, a sentence-transformers CrossEncoder checkpoint."
        ),
    )
    assemble.add_argument("--out", metavar="DIR", required=True, help="output directory")
    assemble.add_argument(
        "--weights", metavar="DIR", help="weights directory (default: the committed export/heads/weights)"
    )
    assemble.set_defaults(run=run_assemble_reranker)


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


def run_train_reranker(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from pathlib import Path

    from bertserve.export.default_model import DEFAULT_SOURCE, default_checkpoint_dir
    from bertserve.export.errors import ExportError
    from bertserve.train.heads.rerank_training import (
        FULL_PLAN,
        LARGE_PLAN,
        QUICK_PLAN,
        fit_fused_score,
        train_reranker,
    )
    from bertserve.train.heads.wordnet import WordNetMissing

    plan = QUICK_PLAN if args.quick else LARGE_PLAN if args.large else FULL_PLAN
    plan = replace(plan, threads=args.threads)
    if args.layers:
        try:
            layers = tuple(int(k) for k in args.layers.split(","))
        except ValueError:
            print(
                f"bertserve train-reranker: error: --layers {args.layers!r}: numbers, e.g. 0,2",
                file=sys.stderr,
            )
            return 2
        if not all(0 <= k <= 6 for k in layers):
            print("bertserve train-reranker: error: --layers: each from 0 to 6", file=sys.stderr)
            return 2
        plan = replace(plan, variants=layers, chosen=layers[-1])
    log = lambda s: print(s, flush=True)  # noqa: E731
    try:
        if args.fit_fusion:
            fit_fused_score(Path(args.out), default_checkpoint_dir(), plan, log=log)
        else:
            train_reranker(Path(args.out), default_checkpoint_dir(), DEFAULT_SOURCE, plan, log=log)
    except (ExportError, WordNetMissing) as e:
        print(f"bertserve train-reranker: error: {e}", file=sys.stderr)
        return 1
    return 0


def run_assemble_reranker(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bertserve.export.default_model import default_checkpoint_dir
    from bertserve.export.errors import ExportError
    from bertserve.export.heads.assemble import COMMITTED_HEADS_DIR
    from bertserve.export.heads.reranker import assemble_reranker

    weights = Path(args.weights) if args.weights else COMMITTED_HEADS_DIR
    try:
        path = assemble_reranker(default_checkpoint_dir(), weights, Path(args.out))
    except ExportError as e:
        print(f"bertserve assemble-reranker: error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0
