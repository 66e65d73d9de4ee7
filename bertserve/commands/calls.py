"""The client's calls as commands: `bertserve embed|fill-mask|classify|rerank|tokenize|info
[--address HOST[:PORT]] [--json [--pretty]] TEXT...|-` (rerank's texts are its documents, beside --query).

`-` as an input reads the inputs from standard input, one per line; `--json` prints the whole typed
result (bertserve/client_results.py), zero values included, on one line (indented with `--pretty`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from bertserve.command_table import describe
from bertserve.commands.common import add_connection_flags, call_or_report, interrupt_closes, print_json

STDIN = "-"
ENCODINGS = ("float", "float16", "int8", "uint8", "binary", "ubinary")


def _describe_embed(result, inputs) -> str:
    """Per input: the vector's first values in each encoding returned, token vectors, sparse weights."""
    import numpy as np

    lines = []
    for row, text in enumerate(inputs):
        lines.append(f"{text!r}: dim {result.dimension}")
        if result.vectors is not None:
            lines[-1] += " [" + ", ".join(f"{v:.4f}" for v in result.vectors[row][:6]) + ", ...]"
        for name, values in result.encodings.items():
            lines.append(f"  {name} [{', '.join(str(v) for v in values[row][:8].tolist())}, ...]")
        if result.chunks is not None:
            lines.append(f"  {result.chunks[row]} windows pooled")
        if result.tokens is not None:
            lines.append(f"  tokens: {result.tokens[row].shape[0]} x {result.tokens[row].shape[1]}")
        if result.sparse is not None:
            weights = result.sparse[row]
            top = np.argsort(-weights.values, kind="stable")[:8]
            shown = ", ".join(f"{weights.indices[i]}: {weights.values[i]:.3f}" for i in top)
            lines.append(f"  sparse: {len(weights.indices)} ids, heaviest {{{shown}}}")
    return "\n".join(lines)


def _describe_fill_mask(result, inputs) -> str:
    lines = []
    for text, filled in zip(inputs, result.results, strict=True):
        lines.append(repr(text))
        for mask in filled.masks:
            for c in mask.candidates:
                lines.append(f"  token {mask.position}: {c.token!r} ({c.score:.4f})  {c.sequence}")
    return "\n".join(lines)


def _describe_classify(result, inputs) -> str:
    lines = []
    for text, classified in zip(inputs, result.results, strict=True):
        labels = ", ".join(f"{s.label} {s.score:.4f}" for s in classified.labels)
        lines.append(f"{text!r}: {labels}")
    return "\n".join(lines)


def _describe_rerank(result, inputs) -> str:
    """One line per document, best first: its index in the request, its score, its text."""
    return "\n".join(f"{r.index}  {r.score:.4f}  {inputs[r.index]!r}" for r in result.results)


def _describe_tokenize(result, inputs) -> str:
    return "\n".join(
        f"{text!r}: " + " ".join(f"{t.text}({t.id})" for t in tokenized.tokens)
        for text, tokenized in zip(inputs, result.results, strict=True)
    )


def _describe_info(result, _inputs) -> str:
    lines = [f"bertserve {result.server_version}"]
    for m in result.models:
        lines.append(
            f"  {m.name} v{m.version}: tasks {', '.join(m.tasks)}; dimension {m.dimension}; max_length "
            f"{m.max_length}; {m.precision} on {m.provider}; default for {', '.join(m.default_for) or '-'}"
        )
        offers = []
        if m.dimensions:
            offers.append(f"dimensions {', '.join(map(str, m.dimensions))}")
        if m.prompts:
            default = f" (default {m.default_prompt_name})" if m.default_prompt_name else ""
            offers.append(f"prompts {', '.join(sorted(m.prompts))}{default}")
        if m.encodings:
            offers.append(f"encodings {', '.join(m.encodings)}")
        if m.sparse:
            offers.append("sparse")
        if m.cosine_of:
            offers.append(f"reranks with {m.cosine_of}'s cosine added")
        if offers:
            lines.append(f"    {'; '.join(offers)}")
    return "\n".join(lines)


def _call_embed(client, args, inputs):
    from bertserve.client import Chunking

    chunking = None
    if args.chunk_length is not None:
        chunking = Chunking(args.chunk_length, args.chunk_overlap, args.chunk_pooling)
    return client.embed(
        inputs,
        model=args.model,
        normalize=args.normalize,
        truncate=args.truncate,
        dimensions=args.dimensions,
        prompt_name=args.prompt_name,
        truncation_direction=args.truncation_direction,
        encodings=args.encodings or (),
        dense=bool(args.encodings),  # beside --tokens or --sparse, an --encoding asks for the vector too
        tokens=args.tokens,
        sparse=args.sparse,
        sparse_threshold=args.sparse_threshold,
        chunking=chunking,
    )


def _call_fill_mask(client, args, inputs):
    return client.fill_mask(inputs, model=args.model, top_k=args.top_k, truncate=args.truncate)


def _call_classify(client, args, inputs):
    return client.classify(
        inputs,
        pairs=args.pairs or (),
        model=args.model,
        top_k=args.top_k,
        raw_scores=args.raw_scores,
        truncate=args.truncate,
    )


def _call_rerank(client, args, inputs):
    """The texts are not asked back (return_documents False): they are filled in from `inputs`."""
    result = client.rerank(
        args.query, inputs, args.top_n, False, args.model, raw_scores=args.raw_scores, truncate=args.truncate
    )
    ranked = [dataclasses.replace(r, document=inputs[r.index]) for r in result.results]
    return dataclasses.replace(result, results=ranked)


def _call_tokenize(client, args, inputs):
    return client.tokenize(inputs, model=args.model, truncate=args.truncate)


def _call_info(client, args, inputs):
    return client.info()


# command -> (how to call the client, how to print the result as text); descriptions live in bertserve/cli.py.
CLIENT_COMMANDS = {
    "embed": (_call_embed, _describe_embed),
    "fill-mask": (_call_fill_mask, _describe_fill_mask),
    "classify": (_call_classify, _describe_classify),
    "rerank": (_call_rerank, _describe_rerank),
    "tokenize": (_call_tokenize, _describe_tokenize),
    "info": (_call_info, _describe_info),
}
TOP_K_HELP = {
    "fill-mask": "candidates per mask, best first (default: 5)",
    "classify": "labels per input, best first (default: every label)",
}


def add_embed_option_flags(parser: argparse.ArgumentParser) -> None:
    """`bertserve embed`'s EmbedOptions (what a model offers: `bertserve info --json`)."""
    parser.add_argument(
        "--dimensions", type=_positive, default=None, metavar="N", help="cut the vectors to N (Matryoshka)"
    )
    parser.add_argument(
        "--prompt-name",
        default="",
        metavar="NAME",
        help="the model's prompt to prepend (default: its default)",
    )
    parser.add_argument(
        "--truncation-direction",
        choices=("right", "left"),
        default="",
        help="with --truncate, the end a long input loses (default: right)",
    )
    parser.add_argument(
        "--encoding",
        dest="encodings",
        action="append",
        choices=ENCODINGS,
        help="an encoding of the vectors, once per encoding (default: float)",
    )
    parser.add_argument(
        "--tokens", action="store_true", help="token-level vectors (with --encoding: also the vector)"
    )
    parser.add_argument("--sparse", action="store_true", help="SPLADE weights (a model with an MLM head)")
    parser.add_argument(
        "--sparse-threshold",
        type=float,
        default=0.0,
        metavar="W",
        help="with --sparse: weights above W (default: 0)",
    )
    parser.add_argument(
        "--chunk-length",
        type=int,
        default=None,
        metavar="TOKENS",
        help="embed long inputs in windows of TOKENS (0: the model's max_length) and pool them",
    )
    parser.add_argument(
        "--chunk-overlap",
        type=int,
        default=0,
        metavar="TOKENS",
        help="with --chunk-length: tokens windows share",
    )
    parser.add_argument(
        "--chunk-pooling", choices=("mean", "max"), default="mean", help="with --chunk-length (default: mean)"
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more (got {value})")
    return value


def read_inputs(arguments: list[str], stdin: typing.TextIO) -> list[str]:
    """The texts of the command line, with `-` replaced by standard input's lines (blank lines skipped)."""
    inputs: list[str] = []
    for argument in arguments:
        if argument == STDIN:
            inputs.extend(line for line in stdin.read().splitlines() if line.strip())
        else:
            inputs.append(argument)
    return inputs


def _json_value(value):
    """Floats that are float32 values (vectors, scores) printed at float32's shortest; the rest as they are."""
    import numpy as np

    if isinstance(value, float):
        single = np.float32(value)
        return float(str(single)) if float(single) == value else value
    if isinstance(value, list):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):
        return {key: _json_value(item) for key, item in value.items()}
    return value


def _run_client(args: argparse.Namespace) -> int:

    from bertserve.client import Client

    inputs = read_inputs(getattr(args, "inputs", []), sys.stdin)
    if hasattr(args, "inputs") and not inputs:
        print(f"bertserve {args.command}: no inputs (standard input had no non-blank line)", file=sys.stderr)
        return 2
    call, describe_result = CLIENT_COMMANDS[args.command]
    with Client(args.address, timeout=args.timeout) as client, interrupt_closes(client) as interrupted:
        result = call_or_report(args.command, client, interrupted, lambda: call(client, args, inputs))
        if result is None:
            return 1
    if args.json:
        print_json(_json_value(result.to_dict()), args.pretty)
    else:
        print(describe_result(result, inputs))
    return 0


def _register_client_command(subparsers, command: str) -> None:
    parser = subparsers.add_parser(command, help=describe(command), description=describe(command))
    add_connection_flags(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the whole result as JSON, on one line (every field, zero values included)",
    )
    parser.add_argument("--pretty", action="store_true", help="with --json: indented, one value a line")
    if command != "info":
        parser.add_argument(
            "--model",
            default="",
            metavar="NAME",
            help="model to ask (default: the server's default for this task, see `bertserve info`)",
        )
        if command == "rerank":
            parser.add_argument(
                "--truncate",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="cut documents to fit the model's max_length beside the query, or refuse them "
                "(default: cut)",
            )
        else:
            parser.add_argument(
                "--truncate",
                action="store_true",
                help="cut inputs longer than the model's max_length instead of refusing them",
            )
        parser.add_argument(
            "inputs",
            nargs="+",
            metavar="TEXT",
            help=f"texts to send; {STDIN} reads them from standard input, one per line (blank lines skipped)",
        )
    if command in TOP_K_HELP:
        parser.add_argument(
            "--top-k", dest="top_k", type=_positive, default=None, metavar="K", help=TOP_K_HELP[command]
        )
    if command == "embed":
        parser.add_argument(
            "--normalize",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="L2-normalize the vectors, or not (default: the model's, see `bertserve info --json`)",
        )
        add_embed_option_flags(parser)
    if command == "classify":
        parser.add_argument(
            "--pair",
            dest="pairs",
            action="append",
            metavar="TEXT",
            help="the second text of a sentence pair, once per input in order (default: single texts)",
        )
    if command in ("classify", "rerank"):
        parser.add_argument(
            "--raw-scores",
            action="store_true",
            help="scores are the raw logits instead of softmax (single-label) or sigmoid (multi-label, "
            "a cross-encoder's one label)",
        )
    if command == "rerank":
        parser.add_argument(
            "--query", required=True, metavar="TEXT", help="the text to rank the documents by"
        )
        parser.add_argument(
            "--top-n",
            dest="top_n",
            type=_positive,
            default=None,
            metavar="N",
            help="the best N (default: all)",
        )
    parser.set_defaults(run=_run_client)


def register(subparsers) -> None:
    for command in CLIENT_COMMANDS:
        _register_client_command(subparsers, command)
