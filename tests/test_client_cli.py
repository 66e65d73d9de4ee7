"""The client as a new user meets it: `wait_until_serving` waits for a server that is still starting, an
address without a port means 50051, a missing server is one line naming the address, Ctrl-C is one line
and exit code 130, `--json` is one line unless `--pretty`; and the client's commands live in the client
package (bertserve/commands/), which the server package never imports, with no import cycle."""

from __future__ import annotations

import ast
import contextlib
import json
import platform
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bertserve import address as addresses
from bertserve.cli import main
from bertserve.client import Client
from tests.helpers.server import ROOT, ServerThread, bertserve_command, taking_sigint


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wait_until_serving_waits_for_a_server_that_starts_later(tiny_repo):
    port = free_port()
    outcome: list[object] = []

    def wait() -> None:
        with Client(f"127.0.0.1:{port}") as client:
            started = time.monotonic()
            try:
                client.wait_until_serving(timeout=120)
                outcome.append(time.monotonic() - started)
            except Exception as exc:  # reported by the test below
                outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(2.0)  # the client is waiting before the server exists
    assert not outcome, outcome  # it did not give up at once
    with ServerThread(model_repo=tiny_repo, port=port):
        waiter.join(120)
    assert not waiter.is_alive()
    (waited,) = outcome
    assert isinstance(waited, float) and waited >= 2.0, waited


def test_wait_until_serving_gives_up_after_its_timeout():
    port = free_port()
    with Client(f"127.0.0.1:{port}") as client:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"127.0.0.1:{port} not SERVING within 1s"):
            client.wait_until_serving(timeout=1.0)
        assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("given", "target"),
    [
        ("localhost", "localhost:50051"),
        ("10.1.2.3", "10.1.2.3:50051"),
        ("[::1]", "[::1]:50051"),
        ("::1", "[::1]:50051"),
        ("dns:///svc.example", "dns:///svc.example:50051"),
        ("localhost:7000", "localhost:7000"),
        ("[::1]:7000", "[::1]:7000"),
        ("unix:/run/bertserve.sock", "unix:/run/bertserve.sock"),
    ],
)
def test_an_address_without_a_port_gets_50051(given, target):
    assert addresses.with_port(given) == target
    with Client(given) as client:
        assert client.address == target


def test_the_cli_connects_to_the_default_port_when_none_is_given(tiny_server, capsys, monkeypatch):
    """`--address localhost` reaches the server on the default port (here the test server's), not 443."""
    monkeypatch.setattr(addresses, "DEFAULT_PORT", tiny_server.server.port)
    assert main(["info", "--address", "localhost"]) == 0, capsys.readouterr().err
    assert "tiny-embed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [["embed", "hi"], ["info"], ["attention", "hi", "--layer", "0", "--head", "0"]],
    ids=lambda argv: argv[0],
)
def test_no_server_is_one_line_naming_the_address(argv, capsys):
    address = f"127.0.0.1:{free_port()}"
    assert main([*argv, "--address", address]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert f"cannot connect to a bertserve server at {address}" in err and "`bertserve serve`" in err


def test_embed_file_without_a_server_is_one_line(tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("the cat\n")
    address = f"127.0.0.1:{free_port()}"
    command = [*bertserve_command(), "embed-file", str(source), "--out", str(tmp_path / "v.npy")]
    done = subprocess.run(
        [*command, "--address", address], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"at {address}" in done.stderr and "`bertserve serve`" in done.stderr


READ_SYSCALL = {"x86_64": 0, "aarch64": 63}  # read(2)'s number, as /proc/PID/syscall shows it


def _wait_until_reading_stdin(pid: int, limit_s: float = 60) -> None:
    """Until the process's main thread is blocked in read(2) on its standard input."""
    number = READ_SYSCALL[platform.machine()]
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
        if fields[:2] == [str(number), "0x0"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never read its standard input")


def test_ctrl_c_ends_a_command_with_one_line_and_130(tiny_server):
    command = taking_sigint([*bertserve_command(), "embed", "--address", tiny_server.address, "-"])
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until_reading_stdin(process.pid)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130
    assert err == "bertserve embed: interrupted\n" and out == ""


def test_ctrl_c_during_a_call_ends_it_with_one_line_and_130():
    """The call waits on a server that accepts the connection and never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        command = taking_sigint([*bertserve_command(), "info", "--address", address, "--timeout", "120"])
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            silent.settimeout(1)
            for _ in range(120):  # a loaded machine may take long to start the command
                with contextlib.suppress(TimeoutError):
                    connection, _ = silent.accept()
                    break
                assert process.poll() is None, process.communicate()[1]
            else:
                raise AssertionError("the command never connected")
            connection.settimeout(60)
            assert connection.recv(65536)  # HTTP/2's preface: the call is under way (channels connect lazily)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=60)
            connection.close()
        finally:
            process.kill()
    assert process.returncode == 130
    assert err == "bertserve info: interrupted\n" and out == ""


def test_json_is_one_line_unless_pretty(tiny_server, capsys):
    argv = ["embed", "--address", tiny_server.address, "--model", "tiny-embed", "--json", "a cat", "a dog"]
    assert main(argv) == 0
    compact = capsys.readouterr().out
    assert compact.count("\n") == 1
    assert main([*argv, "--pretty"]) == 0
    pretty = capsys.readouterr().out
    assert pretty.count("\n") > 2 * 48  # a value a line
    compact, pretty = json.loads(compact), json.loads(pretty)
    assert compact["vectors"] == pretty["vectors"] and len(compact["vectors"]) == 2
    assert compact.keys() == pretty.keys()


# --- where the client's commands live ------------------------------------------------------------------

PACKAGES = {"bertserve": ROOT / "bertserve", "bertserve.service": ROOT / "service"}
GENERATED = ("bertserve.v1", "bertserve.kserve")


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            if not name.startswith(GENERATED) and (package != "bertserve" or parts[0] != "service"):
                found[name] = path
    return found


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The known modules that `path` imports, at its top or inside functions."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative
                base = ".".join(name.split(".")[: -node.level] + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        imported.update(n for n in names if n in known and n != name)
    return imported


def test_the_server_package_imports_no_client_command():
    modules = _modules()
    assert {"bertserve.commands.embed_file", "bertserve.commands.attention"} <= set(modules)
    for name, path in modules.items():
        if name.startswith("bertserve.service"):
            client_side = {
                m for m in _imports(path, name, set(modules)) if m.startswith("bertserve.commands")
            }
            assert not client_side, f"{name} imports the client's commands {client_side}"


def test_no_import_cycle_among_the_commands():
    modules = _modules()
    graph = {name: _imports(path, name, set(modules)) for name, path in modules.items()}
    commands = [m for m in graph if m.startswith("bertserve.commands")]
    for start in commands:  # a path from a command module back to itself is a cycle
        seen, stack = set(), [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                assert nxt != start, "import cycle: " + " -> ".join([*path, nxt])
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
