"""The README's tables that restate code are checked against the code, so they cannot drift: the settings
table against `Settings` (every field once, its default as the code has it), the Monitor table against the
metric families the server registers, the commands table against the `bertserve` parser's subcommands, and
the status table against the HTTP layer's one mapping. Each failure says which row to add, fix or remove.
The README's own Kubernetes overlay renders with kubectl alone."""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from bertserve.cli import build_parser
from bertserve.service.http.status import CODE_OF_STATUS
from bertserve.service.metrics import Metrics
from bertserve.service.settings import Settings
from tests.deploy_support import one, render_kustomize

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 500
CODE_SPAN = re.compile(r"`([^`]*)`")


def section(title: str) -> str:
    """The text of the README's `## title` section, up to the next `## ` heading."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def table(text: str, first_header: str) -> list[list[str]]:
    """The body rows (cells stripped) of the Markdown table whose header's first cell is `first_header`."""
    lines = text.splitlines()
    header = next(
        i for i, line in enumerate(lines) if re.match(rf"\|\s*{re.escape(first_header)}\s*\|", line)
    )
    rows = []
    for line in lines[header + 2 :]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def first_code(cell: str) -> str | None:
    match = CODE_SPAN.match(cell)
    return match.group(1) if match else None


def keyed_rows(rows: list[list[str]], what: str, errors: list[str]) -> dict[str, list[str]]:
    """Rows by the code span that opens their first cell; a row without one, or a key twice, is an error."""
    by_key: dict[str, list[str]] = {}
    for row in rows:
        key = first_code(row[0])
        if key is None:
            errors.append(f"{what}: the row {'|'.join(row)!r} must start with its name in backticks")
        elif key in by_key:
            errors.append(f"{what}: `{key}` has two rows; keep one")
        else:
            by_key[key] = row
    return by_key


def readme_default(value: object) -> str:
    """A setting's default as the README's settings table writes it (inside backticks, or the word unset)."""
    if value is None or value == []:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format(value, "g")  # 1.05, 30, 0
    return str(value)  # ints, strings, Literal choices, Path


def test_the_settings_table_lists_every_setting_with_its_default():
    errors: list[str] = []
    rows = keyed_rows(table(section("Settings"), "setting"), "settings table", errors)
    for name, field in Settings.model_fields.items():
        expected = readme_default(field.get_default(call_default_factory=True))
        shown = f"`{expected}`" if expected != "unset" else "unset"
        if name not in rows:
            errors.append(f"settings table: add the row | `{name}` | {shown} | <what it does> |")
            continue
        cell = rows[name][1]
        match = re.match(r"`([^`]*)`|unset\b", cell)
        found = None if match is None else (match.group(1) if match.group(1) is not None else "unset")
        if found != expected:
            errors.append(
                f"settings table: `{name}`'s default reads {cell!r}; the code's default is {expected!r}: "
                f"start the cell with {shown}"
            )
    for name in rows.keys() - Settings.model_fields.keys():
        errors.append(f"settings table: remove the row `{name}`: Settings has no such field")
    assert not errors, "\n".join(errors)


def registered_metrics() -> dict[str, str]:
    """bertserve_* metric names as /metrics exposes them (counters with `_total`) -> their type."""
    names = {}
    for family in Metrics().registry.collect():
        if family.name.startswith("bertserve_"):
            suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
            names[family.name + suffix] = family.type
    return names


def test_the_monitor_table_lists_every_metric_the_server_registers():
    errors: list[str] = []
    rows = keyed_rows(table(section("Monitor"), "metric"), "Monitor table", errors)
    expected = registered_metrics()
    assert expected, "Metrics registered no bertserve_* family"
    for name, kind in sorted(expected.items()):
        if name not in rows:
            errors.append(f"Monitor table: add the row | `{name}` | {kind} | <labels> | <what it counts> |")
        elif rows[name][1] != kind:
            errors.append(f"Monitor table: `{name}` is a {kind}, the row says {rows[name][1]!r}")
    for name in sorted(rows.keys() - expected.keys()):
        errors.append(f"Monitor table: remove the row `{name}`: the server registers no such metric")
    assert not errors, "\n".join(errors)


def subcommands() -> dict[str, str]:
    """Every subcommand of the `bertserve` console script -> its one-line help."""
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {choice.dest: choice.help or "" for choice in action._choices_actions}


def test_the_commands_table_lists_every_subcommand():
    errors: list[str] = []
    rows = keyed_rows(table(section("Calling it"), "command"), "commands table", errors)
    expected = {f"bertserve {name}": help for name, help in subcommands().items()}
    for command, help in expected.items():
        if command not in rows:
            errors.append(f"commands table (Calling it): add the row | `{command}` | {help} |")
    for command in sorted(rows.keys() - expected.keys()):
        errors.append(f"commands table (Calling it): remove the row `{command}`: the CLI has no such command")
    assert not errors, "\n".join(errors)


def test_the_status_table_is_the_http_layers_mapping():
    errors: list[str] = []
    rows = keyed_rows(table(section("Limits and errors"), "HTTP"), "status table", errors)
    for status, code in sorted(CODE_OF_STATUS.items()):
        row = rows.get(str(status))
        if row is None:
            errors.append(f"status table (Limits and errors): add the row | `{status}` | `{code}` | <when> |")
        elif first_code(row[1]) != code:
            errors.append(
                f"status table: HTTP {status} is {code} in service/http/status.py, the row says {row[1]!r}"
            )
    for status in sorted(rows.keys() - {str(s) for s in CODE_OF_STATUS}):
        errors.append(f"status table: remove the row `{status}`: service/http/status.py has no such status")
    assert not errors, "\n".join(errors)


def test_the_readme_is_a_manual_of_at_most_500_lines_with_working_links():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES, "README.md grew past 500 lines: move details to docs/"
    missing = [
        link
        for link in re.findall(r"\]\(([^)#\s]+)", text)
        if "://" not in link and not (ROOT / link).exists()
    ]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_readme_image_overlay_renders_with_kubectl_alone(tmp_path):
    """The Deploy section's overlay, written beside a copy of deploy/ as a checkout holds it, renders with
    `kubectl kustomize` (no kustomize binary) and sets the Deployment's image."""
    (block,) = re.findall(r"```yaml\n(.*?)```", section("Deploy"), re.S)
    path = block.splitlines()[0].removeprefix("# ").strip()
    shutil.copytree(ROOT / "deploy" / "kubernetes", tmp_path / "deploy" / "kubernetes")
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(block)
    deployment = one(render_kustomize((tmp_path / path).parent), "Deployment")
    images = {c["name"]: c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert images["bertserve"] == "REGISTRY/bertserve:0.1.0-cpu"
