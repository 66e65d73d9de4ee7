"""Subcommands of the serving side: `bertserve serve` and the client commands
`bertserve embed|fill-mask|classify|tokenize|info [--address HOST:PORT] [--json] TEXT...|-`
and `bertserve attention TEXT --layer L --head H --out PNG` (service/attention_plot.py).

Every setting of service/settings.py is a `serve` flag whose help says what it sets, its environment
variable and its default; `-` as an input reads the inputs from standard input, one per line; `--json`
prints the whole typed result (bertserve/client_results.py), zero values included.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing

from bertserve.cli import describe

DEFAULT_ADDRESS = "127.0.0.1:50051"
STDIN = "-"

# What each setting means, for `bertserve serve --help` (the defaults come from the Settings class).
SETTING_HELP = {
    "model_repo": "model repository to serve, as `bertserve export` writes it",
    "host": "address to listen on, gRPC and metrics (0.0.0.0: every interface)",
    "port": "gRPC port (0: pick a free one)",
    "metrics_port": "Prometheus /metrics port (0: pick a free one; -1: no metrics endpoint)",
    "precision": "encoder graph to run",
    "provider": "ONNX Runtime execution provider (auto: CUDA when ONNX Runtime really gets it, else CPU)",
    "intra_op_threads": "ONNX Runtime threads within an operator (0: one per physical core)",
    "inter_op_threads": "ONNX Runtime threads across operators",
    "instances": "batches each encoder computes at once (intra_op_threads threads each)",
    "instance_sessions": "instances as concurrent runs of one session (shared: weights held once) or a session each (separate); auto: shared on CPU, separate on CUDA",
    "max_batch_size": "most inputs in one batch",
    "max_batch_tokens": "most tokens in one batch, counted as padded length x inputs",
    "max_padding_ratio": "a batch stops growing before its padded tokens exceed this multiple of its real tokens",
    "max_queue_delay_ms": "how long an idle model waits for more inputs before it computes",
    "max_queue_inputs": "inputs that may wait or be tokenized per encoder, for unary calls and for streams each; beyond, a unary call gets RESOURCE_EXHAUSTED at once and a stream waits",
    "max_queue_attention": "Attention calls that may wait per encoder; beyond, RESOURCE_EXHAUSTED",
    "max_concurrent_rpcs": "gRPC calls in flight at once, streams included; beyond, RESOURCE_EXHAUSTED at once (0: twice max_queue_inputs)",
    "max_concurrent_streams": "EmbedStream (and other client-streaming) calls open at once; beyond, RESOURCE_EXHAUSTED at once",
    "max_inputs_per_request": "most inputs in one call (INVALID_ARGUMENT beyond)",
    "max_stream_inputs_in_flight": "inputs of one EmbedStream call that may be queued or computing at once",
    "max_stream_batch_tokens": "padded tokens of a batch of stream inputs while unary calls are active",
    "max_input_chars": "most characters in one input (INVALID_ARGUMENT beyond)",
    "max_masks_per_input": "most mask tokens in one FillMask input (INVALID_ARGUMENT beyond)",
    "max_message_bytes": "largest gRPC request or reply, in bytes",
    "grace_period_s": "seconds to finish accepted calls after SIGTERM or SIGINT",
    "tls_cert": "PEM certificate chain: serve TLS (with --tls-key)",
    "tls_key": "PEM private key of --tls-cert",
    "tls_client_ca": "PEM CA certificate: clients must present a certificate it signed (mutual TLS)",
    "log_level": "log level",
    "http_port": "HTTP port: OpenAI-compatible, bertserve JSON and KServe v2 REST (0: pick a free one; -1: no HTTP)",
    "http_max_connections": "most open HTTP connections, TLS handshakes included; beyond, 503 and closed",
    "http_max_body_bytes_in_flight": "bytes of HTTP request bodies held at once, all connections; beyond, 503",
    "http_read_timeout_s": "seconds an HTTP client has to send its request headers, then its body",
    "http_keep_alive_s": "seconds an idle HTTP keep-alive connection stays open",
}


def _setting_help(name: str, field) -> str:
    from bertserve.service.settings import ENV_PREFIX

    # A setting added without help still gets a flag (tests/test_server_cli.py asserts each has help).
    text = field.description or SETTING_HELP.get(name) or name.replace("_", " ")
    default = field.get_default(call_default_factory=True)
    shown = "unset" if default is None else default
    return f"{text} (env {ENV_PREFIX}{name.upper()}; default: {shown})"


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, from the Settings class itself; unset flags leave env/defaults in place."""
    from bertserve.service.settings import Settings

    for name, field in Settings.model_fields.items():
        if name == "models":
            parser.add_argument(
                "--model",
                dest="models",
                action="append",
                metavar="NAME[:VERSION]",
                help="serve only this model, at this version or its highest (repeatable; the first listed "
                "model with a task is that task's default; env BERTSERVE_MODELS, comma-separated; "
                "default: every model in the repository)",
            )
            continue
        choices = (
            typing.get_args(field.annotation)
            if typing.get_origin(field.annotation) is typing.Literal
            else None
        )
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            choices=choices,
            type=str.upper if choices and all(c.isupper() for c in choices) else None,
            metavar=None if choices else name.upper(),
            help=_setting_help(name, field),
        )


def _run_serve(args: argparse.Namespace) -> int:
    from bertserve.service.main import serve
    from bertserve.service.settings import Settings, SettingsError, load_settings

    overrides = {name: getattr(args, name, None) for name in Settings.model_fields}
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        print(f"bertserve serve: {exc}", file=sys.stderr)
        return 2
    return serve(settings)


# --- client commands -----------------------------------------------------------------------------------


def _describe_embed(result, inputs) -> str:
    lines = []
    for text, vector in zip(inputs, result.vectors, strict=True):
        head = ", ".join(f"{v:.4f}" for v in vector[:6])
        lines.append(f"{text!r}: dim {len(vector)} [{head}, ...]")
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
    return "\n".join(lines)


def _call_embed(client, args, inputs):
    return client.embed(inputs, model=args.model, normalize=args.normalize, truncate=args.truncate)


def _call_fill_mask(client, args, inputs):
    return client.fill_mask(inputs, model=args.model, top_k=args.top_k, truncate=args.truncate)


def _call_classify(client, args, inputs):
    return client.classify(
        inputs, model=args.model, top_k=args.top_k, raw_scores=args.raw_scores, truncate=args.truncate
    )


def _call_tokenize(client, args, inputs):
    return client.tokenize(inputs, model=args.model, truncate=args.truncate)


def _call_info(client, args, inputs):
    return client.info()


# command -> (how to call the client, how to print the result as text); descriptions live in bertserve/cli.py.
CLIENT_COMMANDS = {
    "embed": (_call_embed, _describe_embed),
    "fill-mask": (_call_fill_mask, _describe_fill_mask),
    "classify": (_call_classify, _describe_classify),
    "tokenize": (_call_tokenize, _describe_tokenize),
    "info": (_call_info, _describe_info),
}
TOP_K_HELP = {
    "fill-mask": "candidates per mask, best first (default: 5)",
    "classify": "labels per input, best first (default: every label)",
}


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
    import grpc

    from bertserve.client import Client

    inputs = read_inputs(getattr(args, "inputs", []), sys.stdin)
    if hasattr(args, "inputs") and not inputs:
        print(f"bertserve {args.command}: no inputs (standard input had no non-blank line)", file=sys.stderr)
        return 2
    call, describe_result = CLIENT_COMMANDS[args.command]
    try:
        with Client(args.address, timeout=args.timeout) as client:
            result = call(client, args, inputs)
    except grpc.RpcError as exc:
        print(f"bertserve {args.command}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(_json_value(result.to_dict()), indent=2))
    else:
        print(describe_result(result, inputs))
    return 0


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        metavar="HOST:PORT",
        help=f"server address (default: {DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, metavar="SECONDS", help="deadline of the call (default: 30)"
    )


def _register_client_command(subparsers, command: str) -> None:
    parser = subparsers.add_parser(command, help=describe(command), description=describe(command))
    add_connection_flags(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the whole result as JSON (every field, zero values included)",
    )
    if command != "info":
        parser.add_argument(
            "--model",
            default="",
            metavar="NAME",
            help="model to ask (default: the server's default for this task, see `bertserve info`)",
        )
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
    if command == "classify":
        parser.add_argument(
            "--raw-scores",
            action="store_true",
            help="scores are the raw logits instead of softmax (single-label) or sigmoid (multi-label)",
        )
    parser.set_defaults(run=_run_client)


def register(subparsers) -> None:
    serve = subparsers.add_parser(
        "serve",
        help=describe("serve"),
        description=describe("serve") + ". Every flag is also an environment variable; flags win.",
    )
    _add_setting_flags(serve)
    serve.set_defaults(run=_run_serve)
    for command in CLIENT_COMMANDS:
        _register_client_command(subparsers, command)

    # `bertserve attention`: draws one head's map (matplotlib, client side)
    from bertserve.service import attention_plot

    attention_plot.register(subparsers)
