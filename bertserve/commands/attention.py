"""`bertserve attention TEXT --layer L --head H [--out map.png]`: one attention map from a running server,
printed as a table (each query token's strongest key token) and, with `--out`, drawn as a heatmap with
the tokens as labels (query tokens down the side, key tokens along the bottom).

Client side only: matplotlib is imported only to draw (Agg, no display), never by the server.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

MATPLOTLIB_MISSING = (
    "--out needs matplotlib to draw the map, which is not installed here (pip install matplotlib); "
    "without --out the table is printed without it"
)


def _index(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more (got {value})")
    return value


def register(subparsers) -> None:
    from bertserve.command_table import describe
    from bertserve.commands.common import add_connection_flags

    parser = subparsers.add_parser(
        "attention",
        help=describe("attention"),
        description="Ask the server's Attention RPC for one layer and head; print each query token's "
        "strongest key token and, with --out, draw the map as a heatmap (needs matplotlib).",
    )
    parser.add_argument("text", metavar="TEXT", help="the text whose attention map to draw")
    add_connection_flags(parser)
    parser.add_argument(
        "--model",
        default="",
        metavar="NAME",
        help="model to ask (default: the server's default for Attention, see `bertserve info`)",
    )
    parser.add_argument("--layer", type=_index, required=True, metavar="L", help="layer, from 0")
    parser.add_argument("--head", type=_index, required=True, metavar="H", help="head, from 0")
    parser.add_argument(
        "--out", type=Path, metavar="PNG", help="also draw the map into this image file (needs matplotlib)"
    )
    parser.add_argument(
        "--truncate",
        action="store_true",
        help="cut a text longer than the model's max_length instead of refusing it",
    )
    parser.set_defaults(run=run)


def draw_heatmap(matrix, labels: Sequence[str], title: str, out: Path) -> None:
    """matrix: (T, T) rows = query tokens, columns = key tokens. Writes a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(labels)
    side = min(40.0, max(4.0, 0.3 * n + 2.0))  # inches: about 0.3 per token, within reason
    font = max(4.0, min(10.0, 300.0 / max(n, 1)))
    figure = Figure(figsize=(side + 1.5, side))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(matrix, cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    axes.set_xticks(range(n), labels, rotation=90, fontsize=font)
    axes.set_yticks(range(n), labels, fontsize=font)
    text_size = max(10.0, 0.6 * side)  # title and axis labels grow with the figure
    axes.set_xlabel("key token (attended to)", fontsize=text_size)
    axes.set_ylabel("query token", fontsize=text_size)
    axes.set_title(title, fontsize=text_size)
    bar = figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    bar.set_label("attention probability", fontsize=text_size)
    figure.tight_layout()
    figure.savefig(out, dpi=120)


def describe(matrix, labels: Sequence[str]) -> str:
    """Per query token, the key token it attends to most."""
    lines = []
    for query, row in zip(labels, matrix, strict=True):
        key = int(row.argmax())
        lines.append(f"  {query:>14} -> {labels[key]} ({row[key]:.3f})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.out is not None:
        try:
            import matplotlib  # noqa: F401  (checked before calling the server)
        except ImportError:
            print(f"bertserve attention: {MATPLOTLIB_MISSING}", file=sys.stderr)
            return 1

    from bertserve.client import Client
    from bertserve.commands.common import call_or_report, interrupt_closes

    with Client(args.address, timeout=args.timeout) as client, interrupt_closes(client) as interrupted:
        response = call_or_report(
            "attention",
            client,
            interrupted,
            lambda: client.attention(
                args.text, model=args.model, layers=[args.layer], heads=[args.head], truncate=args.truncate
            ),
        )
        if response is None:
            return 1
    matrix = response.matrix(args.layer, args.head)  # (T, T)
    labels = [token.text for token in response.tokens]
    meta = response.metadata
    title = f"{meta.model} v{meta.model_version}: layer {args.layer}, head {args.head}"
    if args.out is not None:
        try:
            draw_heatmap(matrix, labels, title, args.out)
        except OSError as exc:
            print(f"bertserve attention: cannot write {args.out}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.out}: {title} ({len(labels)} tokens); each query token's strongest key:")
    else:
        print(f"{title} ({len(labels)} tokens); each query token's strongest key:")
    print(describe(matrix, labels))
    return 0
