"""The README's HTTP examples run: every `curl` line of its HTTP and Embedding options sections and its
`openai` client example, and the quick start's call on each port, against a live server on the tiny repository (the README's model
names mapped to the tiny ones)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.helpers.server import ROOT

MODELS = {
    "all-minilm-l6-v2": "tiny-embed",
    "wordnet-fill-mask": "tiny-mlm",
    "wordnet-noun-category": "tiny-classifier",
}


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    return text[start : text.index("\n## ", start + 1)]


def http_section() -> str:
    return readme_section("HTTP")


def localized(text: str, base_url: str) -> str:
    for readme_name, tiny_name in MODELS.items():
        text = text.replace(readme_name, tiny_name)
    return text.replace("http://localhost:8080", base_url).replace("localhost:8080", base_url)


def curl_commands(text: str | None = None) -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", http_section() if text is None else text, re.S):
        joined = block.replace("\\\n", " ")
        commands += [line.strip() for line in joined.splitlines() if line.strip().startswith("curl ")]
    return commands


def run_curl(command: str, base_url: str) -> object:
    """One README curl line against `base_url`; its JSON answer (the command must succeed)."""
    argv = shlex.split(localized(command, base_url))
    argv[1:1] = ["--fail-with-body", "--max-time", "30"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, (command, result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_readme_curl_examples_run(tiny_server):
    commands = curl_commands()
    assert len(commands) >= 8
    for command in commands:
        assert isinstance(run_curl(command, tiny_server.http_url), dict), command


def test_readme_embedding_option_examples_run(tiny_server):
    """The Embedding options section's curl lines (TEI's routes answer JSON arrays)."""
    commands = curl_commands(readme_section("Embedding options"))
    assert len(commands) >= 3
    for command in commands:
        assert run_curl(command, tiny_server.http_url), command


def test_readme_openai_example_runs(tiny_server, capsys):
    (code,) = re.findall(r"```python\n(.*?)```", http_section(), re.S)
    exec(compile(localized(code, tiny_server.http_url), "README.md", "exec"), {})
    count, dimension, tokens = capsys.readouterr().out.split()
    assert (count, dimension) == ("2", "48") and int(tokens) > 4


def test_readme_quick_start_calls_each_port(tiny_server):
    """The quick start's three lines (the CLI on gRPC, curl on HTTP, curl | grep on /metrics) succeed."""
    (block,) = re.findall(r"```bash\n(.*?)```", readme_section("Quick start"), re.S)
    lines = [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    assert len(lines) == 3 and "8080" in block and "8002" in block and "50051" in block
    bertserve = str(Path(sys.executable).parent / "bertserve")
    for line in lines:
        command = localized(line, tiny_server.http_url).replace(
            "localhost:8002/metrics", tiny_server.metrics_url
        )
        command = re.sub(
            r"\.venv/bin/bertserve (\S+)", rf"{bertserve} \1 --address {tiny_server.address}", command
        )
        command = command.replace("curl ", "curl --fail-with-body --max-time 30 ")
        result = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0 and result.stdout.strip(), (line, result.stdout, result.stderr)
