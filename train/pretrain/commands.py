"""`bertserve pretrain`, `bertserve pack-pretrained` and `bertserve assemble-pretrained`: registered into the console script by bertserve/cli.py."""

from __future__ import annotations

import argparse
import json
import sys

from bertserve.command_table import describe


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "pretrain",
        help=describe("pretrain"),
        description=(
            "Masked-language-model training of a BERT checkpoint (or of a random one, --from-scratch): 15%% of "
            "the tokens (or whole words) chosen, 80%% of those [MASK], 10%% a random token, 10%% kept; the "
            "encoder layers in --train-layers and the MLM head train, the rest stays frozen. Deterministic for "
            "a seed; resumable (OUT/resume.pt); measures top-1/top-5 on held-out text at the end. Writes "
            "OUT/checkpoint/ (a BertForMaskedLM checkpoint for `bertserve export`), OUT/trained.safetensors "
            "(the trained tensors alone) and OUT/pretrain.json (recipe, figures, checksums)."
        ),
    )
    start = parser.add_mutually_exclusive_group(required=True)
    start.add_argument("--checkpoint", metavar="DIR", help="Hugging Face BertModel/BertForMaskedLM directory")
    start.add_argument(
        "--default",
        action="store_true",
        help="the default model (all-MiniLM-L6-v2) with the committed WordNet MLM head as the starting head",
    )
    parser.add_argument(
        "--head", metavar="FILE", help="MLM head (cls.predictions.* safetensors) to start from"
    )
    parser.add_argument(
        "--from-scratch", action="store_true", help="random weights; the checkpoint's config and tokenizer"
    )
    _text_arguments(parser, "the training text")
    parser.add_argument("--out", metavar="DIR", required=True, help="output directory")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps of the schedule")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per step (default 64)")
    parser.add_argument(
        "--learning-rate", type=float, default=3e-4, help="peak AdamW learning rate (default 3e-4)"
    )
    parser.add_argument(
        "--warmup-steps", type=int, default=100, help="linear warmup, then linear decay to 0 (default 100)"
    )
    parser.add_argument(
        "--weight-decay",
        type=float,
        default=0.01,
        help="AdamW weight decay, not on biases and LayerNorm (default 0.01)",
    )
    parser.add_argument(
        "--train-layers", default="all", metavar="START:STOP", help="encoder layers to train (default all)"
    )
    parser.add_argument(
        "--train-embeddings", action="store_true", help="train the embeddings (and the tied decoder)"
    )
    parser.add_argument("--whole-word", action="store_true", help="whole-word masking")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the batch order, masking and dropout (default 0)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/resume.pt when present")
    parser.add_argument("--stop-after", type=int, metavar="STEPS", help="stop at this step (resumable)")
    parser.add_argument(
        "--time-budget", type=float, metavar="MINUTES", help="stop after this long (resumable)"
    )
    parser.add_argument("--save-every", type=int, default=200, metavar="STEPS", help="state saved this often")
    parser.add_argument(
        "--evaluate-initial", action="store_true", help="also measure the model before training"
    )
    parser.set_defaults(run=run_pretrain)

    pack = subparsers.add_parser(
        "pack-pretrained",
        help=describe("pack-pretrained"),
        description=(
            "Checks that each stage (a `bertserve pretrain` output directory) started from the previous "
            "stage's checkpoint, the first from the base model; writes OUT/trained.safetensors (the last "
            "checkpoint's tensors that differ from the base, in --dtype) and OUT/pretrain.json (every stage's "
            "recipe and figures, the modules still shared with the base, and the held-out WordNet figures "
            "measured again on the packed tensors)."
        ),
    )
    pack.add_argument("stages", nargs="+", metavar="STAGE_DIR", help="pretrain output directories, in order")
    pack.add_argument("--out", metavar="DIR", required=True, help="output directory")
    pack.add_argument("--checkpoint", metavar="DIR", help="base checkpoint (default: the default model)")
    pack.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="(default float16)")
    pack.add_argument(
        "--continues",
        metavar="PACKED_DIR",
        help="an earlier pack on this base: the first stage started from it assembled (assemble-pretrained); "
        "the record lists its stages first",
    )
    pack.add_argument(
        "--heads-json",
        metavar="FILE",
        help="also summarize the recipe and figures in this heads.json (train-heads' record) as "
        "fill_mask_pretraining",
    )
    _text_arguments(pack, "the text the last stage trained on (its held-out part is measured again)")
    pack.set_defaults(run=run_pack)

    assemble = subparsers.add_parser(
        "assemble-pretrained",
        help=describe("assemble-pretrained"),
        description=(
            "Rebuild the full BertForMaskedLM checkpoint from a base checkpoint and pretrained tensors "
            "(trained.safetensors + pretrain.json, sha256 checked; default: the committed "
            "export/pretrain/weights on the default model)."
        ),
    )
    assemble.add_argument("--out", metavar="DIR", required=True, help="output directory")
    assemble.add_argument(
        "--weights", metavar="DIR", help="directory of trained.safetensors and pretrain.json"
    )
    assemble.add_argument("--checkpoint", metavar="DIR", help="base checkpoint (default: the default model)")
    assemble.set_defaults(run=run_assemble)


def run_pretrain(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from bertserve.export.errors import ExportError
    from bertserve.train.heads.wordnet import WordNetMissing
    from bertserve.train.pretrain.masking import MaskingScheme
    from bertserve.train.pretrain.model_setup import LayerRange
    from bertserve.train.pretrain.pipeline import Source, pretrain
    from bertserve.train.pretrain.train import Recipe

    try:
        if args.default:
            from bertserve.export.default_model import DEFAULT_SOURCE, default_checkpoint_dir
            from bertserve.export.heads.assemble import COMMITTED_HEADS_DIR, MLM_FILE, verify_heads

            verify_heads(COMMITTED_HEADS_DIR)
            checkpoint_dir, name = default_checkpoint_dir(), DEFAULT_SOURCE
            head = Path(args.head) if args.head else COMMITTED_HEADS_DIR / MLM_FILE
        else:
            checkpoint_dir, name = Path(args.checkpoint), Path(args.checkpoint).name
            head = Path(args.head) if args.head else None
        from bertserve.export.checkpoint import read_config

        layers = LayerRange.parse(args.train_layers, read_config(checkpoint_dir).num_hidden_layers)
        recipe = Recipe(
            steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            warmup_steps=args.warmup_steps,
            weight_decay=args.weight_decay,
            seed=args.seed,
            layers=(layers.start, layers.stop),
            train_embeddings=args.train_embeddings or args.from_scratch,
            masking=MaskingScheme(whole_word=args.whole_word),
            threads=args.threads,
        )
        source = Source(
            checkpoint_dir,
            name,
            head,
            args.from_scratch,
            tuple(Path(p) for p in args.text),
            args.wordnet,
            args.held_out_percent,
        )
        deadline = time.time() + 60 * args.time_budget if args.time_budget else None
        pretrain(
            source,
            recipe,
            Path(args.out),
            resume=args.resume,
            stop_after=args.stop_after,
            deadline=deadline,
            save_every=args.save_every,
            evaluate_initial=args.evaluate_initial,
            log=lambda s: print(s, flush=True),
        )
    except (ExportError, WordNetMissing, ValueError, OSError) as e:
        print(f"bertserve pretrain: error: {e}", file=sys.stderr)
        return 1
    return 0


def _text_arguments(parser: argparse.ArgumentParser, title: str) -> None:
    group = parser.add_argument_group(title)
    group.add_argument(
        "--text", metavar="FILE", action="append", default=[], help="text, one per line (repeatable)"
    )
    group.add_argument(
        "--wordnet", action="store_true", help="WordNet glosses (held out: export/heads' split)"
    )
    group.add_argument("--held-out-percent", type=int, default=5, help="of --text lines, by hash (default 5)")


def _base(args: argparse.Namespace):
    """(directory, name) of --checkpoint, else of the default model."""
    from pathlib import Path

    if args.checkpoint:
        return Path(args.checkpoint), Path(args.checkpoint).name
    from bertserve.export.default_model import DEFAULT_SOURCE, default_checkpoint_dir

    return default_checkpoint_dir(), DEFAULT_SOURCE


def run_pack(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bertserve.export.errors import ExportError
    from bertserve.train.heads.wordnet import WordNetMissing
    from bertserve.train.pretrain.pack import pack, summarize_in_heads_record
    from bertserve.train.pretrain.pipeline import Source

    try:
        base, name = _base(args)
        data = Source(
            base, name, None, False, tuple(Path(p) for p in args.text), args.wordnet, args.held_out_percent
        )
        continues = Path(args.continues) if args.continues else None
        stages = [Path(s) for s in args.stages]
        record = pack(base, name, stages, Path(args.out), data, args.dtype, log=print, continues=continues)
        if args.heads_json:
            summarize_in_heads_record(Path(args.heads_json), Path(args.out), record)
    except (ExportError, WordNetMissing, OSError, KeyError, json.JSONDecodeError) as e:
        print(f"bertserve pack-pretrained: error: {e}", file=sys.stderr)
        return 1
    return 0


def run_assemble(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bertserve.export.errors import ExportError
    from bertserve.export.pretrain.output import COMMITTED_DIR, assemble

    try:
        base, _ = _base(args)
        written = assemble(base, Path(args.weights) if args.weights else COMMITTED_DIR, Path(args.out))
    except (ExportError, OSError, KeyError) as e:
        print(f"bertserve assemble-pretrained: error: {e}", file=sys.stderr)
        return 1
    print(written)
    return 0
