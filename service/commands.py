"""Subcommands of the serving side: `bertserve serve` and the client commands
`bertserve embed|fill-mask|classify|tokenize|info --address HOST:PORT [--json] TEXT...`
and `bertserve attention TEXT --layer L --head H --out PNG` (service/attention_plot.py)."""

from __future__ import annotations

import argparse
import json
import sys


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
                help="serve only this model (repeatable; the first with a task is its default)",
            )
            continue
        default = field.get_default(call_default_factory=True)
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            metavar=name.upper(),
            help=f"(env BERTSERVE_{name.upper()}, default {default})",
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


def _print(response, as_json: bool, text: str) -> None:
    if as_json:
        from google.protobuf.json_format import MessageToDict

        print(json.dumps(MessageToDict(response, preserving_proto_field_name=True), indent=2))
    else:
        print(text)


def _describe_embed(response, inputs) -> str:
    lines = []
    for text, embedding in zip(inputs, response.embeddings, strict=True):
        head = ", ".join(f"{v:.4f}" for v in embedding.values[:6])
        lines.append(f"{text!r}: dim {len(embedding.values)} [{head}, ...]")
    return "\n".join(lines)


def _describe_fill_mask(response, inputs) -> str:
    lines = []
    for text, result in zip(inputs, response.results, strict=True):
        lines.append(repr(text))
        for mask in result.masks:
            for c in mask.candidates:
                lines.append(f"  token {mask.position}: {c.token!r} ({c.score:.4f})  {c.sequence}")
    return "\n".join(lines)


def _describe_classify(response, inputs) -> str:
    lines = []
    for text, result in zip(inputs, response.results, strict=True):
        labels = ", ".join(f"{s.label} {s.score:.4f}" for s in result.labels)
        lines.append(f"{text!r}: {labels}")
    return "\n".join(lines)


def _describe_tokenize(response, inputs) -> str:
    return "\n".join(
        f"{text!r}: " + " ".join(f"{t.text}({t.id})" for t in result.tokens)
        for text, result in zip(inputs, response.results, strict=True)
    )


def _describe_info(response) -> str:
    lines = [f"bertserve {response.server_version}"]
    for m in response.models:
        lines.append(
            f"  {m.name} v{m.version}: tasks {', '.join(m.tasks)}; dimension {m.dimension}; max_length "
            f"{m.max_length}; {m.precision} on {m.provider}; default for {', '.join(m.default_for) or '-'}"
        )
    return "\n".join(lines)


def _run_client(args: argparse.Namespace) -> int:
    import grpc

    from bertserve.client import Client

    try:
        with Client(args.address, timeout=args.timeout) as client:
            if args.command == "info":
                response = client.info()
                _print(response, args.json, _describe_info(response))
                return 0
            inputs = args.inputs
            if args.command == "embed":
                response = client.embed(inputs, model=args.model, truncate=args.truncate)
                text = _describe_embed(response, inputs)
            elif args.command == "fill-mask":
                response = client.fill_mask(
                    inputs, model=args.model, top_k=args.top_k, truncate=args.truncate
                )
                text = _describe_fill_mask(response, inputs)
            elif args.command == "classify":
                response = client.classify(inputs, model=args.model, top_k=args.top_k, truncate=args.truncate)
                text = _describe_classify(response, inputs)
            else:
                response = client.tokenize(inputs, model=args.model, truncate=args.truncate)
                text = _describe_tokenize(response, inputs)
            _print(response, args.json, text)
            return 0
    except grpc.RpcError as exc:
        print(f"bertserve {args.command}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1


def register(subparsers) -> None:
    serve = subparsers.add_parser("serve", help="serve a model repository over gRPC")
    _add_setting_flags(serve)
    serve.set_defaults(run=_run_serve)

    helps = {
        "embed": "sentence embeddings",
        "fill-mask": "fill the mask tokens",
        "classify": "classify the inputs",
        "tokenize": "show the tokens",
        "info": "the server's models and limits",
    }
    for command, help_text in helps.items():
        parser = subparsers.add_parser(command, help=f"client: {help_text}")
        parser.add_argument("--address", default="127.0.0.1:50051", metavar="HOST:PORT")
        parser.add_argument("--json", action="store_true", help="print the response as JSON")
        parser.add_argument("--timeout", type=float, default=30.0, help="seconds")
        if command != "info":
            parser.add_argument("--model", default="", help="model name (default: the server's default)")
            parser.add_argument("--truncate", action="store_true", help="cut inputs longer than max_length")
            parser.add_argument("inputs", nargs="+", metavar="TEXT")
        if command in ("fill-mask", "classify"):
            parser.add_argument("--top-k", dest="top_k", type=int, default=None)
        parser.set_defaults(run=_run_client)

    # `bertserve attention`: draws one head's map (matplotlib, client side)
    from bertserve.service import attention_plot

    attention_plot.register(subparsers)
