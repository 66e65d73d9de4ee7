"""The serving side's subcommand, `bertserve serve` (the client's commands live in bertserve/commands/).

Every setting of service/settings.py is a `serve` flag whose help says what it sets, its environment
variable and its default.
"""

from __future__ import annotations

import argparse
import sys
import typing

from bertserve.command_table import describe

# What each setting means, for `bertserve serve --help` (the defaults come from the Settings class).
SETTING_HELP = {
    "model_repo": "model repository to serve, as `bertserve export` writes it",
    "host": "address to listen on, gRPC and metrics (0.0.0.0: every interface)",
    "port": "gRPC port (0: pick a free one)",
    "metrics_port": "Prometheus /metrics port (0: pick a free one; -1: no metrics endpoint)",
    "precision": "encoder graph to run",
    "provider": "ONNX Runtime execution provider (auto: CUDA when ONNX Runtime really gets it, else CPU)",
    "cuda_sync": "how a thread waiting for the GPU waits: auto (CUDA's choice: it spins, a core per "
    "instance), blocking (sleeps), yield, spin",
    "cuda_graphs": "each batch shape of an encoder on CUDA replayed as a CUDA graph, one launch per batch "
    "(needs batch_shapes buckets and instances 1): auto where the session can, on (refuses to start where "
    "not), off",
    "intra_op_threads": "ONNX Runtime threads within an operator (0: one per physical core)",
    "inter_op_threads": "ONNX Runtime threads across operators",
    "instances": "batches each encoder computes at once (intra_op_threads threads each)",
    "instance_sessions": "instances as concurrent runs of one session (shared: weights held once) or a session each (separate); auto: shared on CPU, separate on CUDA",
    "max_batch_size": "most inputs in one batch",
    "max_batch_tokens": "most tokens in one batch, counted as padded length x inputs",
    "max_padding_ratio": "a batch stops growing before its padded tokens exceed this multiple of its real tokens",
    "batch_cut": "how a batch is picked from the queue: padding (the oldest input and its neighbours in length), cost (the batch nearest a full unpadded one, by a line fitted through the batches' times), auto (cost with shape buckets)",
    "batch_shapes": "buckets: each batch padded up to one of a few shapes, all run once before serving (a GPU "
    "runs a new shape slowly the first time); exact: as it comes; auto: buckets on CUDA",
    "max_queue_delay_ms": "how long an idle model waits for more inputs before it computes",
    "max_queue_inputs": "inputs that may wait or be tokenized per encoder, for unary calls and for streams each; beyond, a unary call gets RESOURCE_EXHAUSTED at once and a stream waits",
    "max_queue_attention": "Attention calls that may wait per encoder; beyond, RESOURCE_EXHAUSTED",
    "max_concurrent_rpcs": "gRPC calls in flight at once, streams included; beyond, RESOURCE_EXHAUSTED at once (0: twice max_queue_inputs)",
    "max_concurrent_streams": "EmbedStream (and other client-streaming) calls open at once; beyond, RESOURCE_EXHAUSTED at once",
    "max_inputs_per_request": "most inputs in one call (INVALID_ARGUMENT beyond)",
    "max_stream_inputs_in_flight": "inputs of one EmbedStream call that may be queued or computing at once",
    "max_stream_batch_tokens": "padded tokens of a batch of stream inputs while unary calls are active",
    "max_input_chars": "most characters in one input (INVALID_ARGUMENT beyond)",
    "tokenize_threads": "threads that tokenize one large call's texts at once (0: the usable CPUs, at most 8)",
    "native_tokenizer": "plain ASCII texts tokenized for the graph by the C++ WordPiece (false: always the tokenizers library)",
    "auto_truncate": "embedding calls cut every input longer than max_length as if they set truncate",
    "max_masks_per_input": "most mask tokens in one FillMask input (INVALID_ARGUMENT beyond)",
    "max_message_bytes": "largest gRPC request or reply, in bytes",
    "max_request_bytes_in_flight": "bytes of gRPC request messages held by unary calls in flight, and again of those still arriving; beyond, RESOURCE_EXHAUSTED at once",
    "grace_period_s": "seconds to finish accepted calls after SIGTERM or SIGINT",
    "tls_cert": "PEM certificate chain: serve TLS (with --tls-key)",
    "tls_key": "PEM private key of --tls-cert",
    "tls_client_ca": "PEM CA certificate: clients must present a certificate it signed (mutual TLS)",
    "log_level": "log level",
    "http_port": "HTTP port: OpenAI-compatible, bertserve JSON and KServe v2 REST (0: pick a free one; -1: no HTTP)",
    "grpc_transport": "what serves the gRPC port: python (grpc.aio) or native (gRPC's C++ server: unary calls there, streams relayed to grpc.aio; needs native_port off)",
    "native_port": "port of the native gRPC front: every method of the main port through gRPC's C++ server (unary calls in C++, streams relayed), batched with every other call (0: pick a free one; -1: off; with workers > 1 every front serves it)",
    "http_max_connections": "most open HTTP connections, TLS handshakes included; beyond, 503 and closed",
    "http_max_body_bytes_in_flight": "bytes of HTTP request bodies held at once, all connections; beyond, 503",
    "http_max_reply_bytes_in_flight": "bytes of HTTP replies their clients have not taken yet, all connections; beyond, the connection waiting longest is closed",
    "http_read_timeout_s": "seconds an HTTP client has to send its request headers, then its body (a gRPC call: its request message)",
    "http_keep_alive_s": "seconds an idle HTTP keep-alive connection stays open",
    "simulated_device_ms": "above 0: encoder batches answered with constant outputs after this many ms, without computing (bertserve bench only)",
    "simulated_device_us_per_token": "with simulated_device_ms: this many microseconds more per padded token of a batch",
    "workers": "front processes sharing the ports and feeding the engine processes (auto: 1 on 2 CPUs or fewer, else one per CPU but one, at most 8)",
    "engines": "engine processes (workers > 1, at most workers): each owns its own sessions and batchers and serves front i when i % engines is its index",
}


def _setting_help(name: str, field) -> str:
    from bertserve.service.settings import ENV_PREFIX

    # A setting added without help still gets a flag (tests/test_server_cli.py asserts each has help).
    text = field.description or SETTING_HELP.get(name) or name.replace("_", " ")
    default = field.get_default(call_default_factory=True)
    shown = "unset" if default is None else default
    # argparse formats help with %: a literal one ("i % engines") is doubled
    return f"{text} (env {ENV_PREFIX}{name.upper()}; default: {shown})".replace("%", "%%")


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
    from bertserve.service.settings import Settings, SettingsError, load_settings
    from bertserve.service.supervisor.main import serve

    overrides = {name: getattr(args, name, None) for name in Settings.model_fields}
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        print(f"bertserve serve: {exc}", file=sys.stderr)
        return 2
    return serve(settings)


def register(subparsers) -> None:
    serve = subparsers.add_parser(
        "serve",
        help=describe("serve"),
        description=describe("serve") + ". Every flag is also an environment variable; flags win.",
    )
    _add_setting_flags(serve)
    serve.set_defaults(run=_run_serve)
