"""`bertserve embed-file` (service/embed_file.py) as a subprocess against a real server: vectors equal to
unary Embed, resume after SIGKILL without recomputing, JSON Lines in and out, a progress bar on a
terminal, refusals that keep the progress."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import termios

import numpy as np
import pytest

from bertserve.client import Client
from tests.helpers.server import ROOT, bertserve_command, metric, scrape
from tests.helpers.texts import random_texts

MODEL = "tiny-embed"
LINES = 5_000
KILL_AFTER_ROWS = 1_000  # the first run is killed once this many rows are written (of LINES // 2 fed)


def corpus(n: int, seed: int = 11) -> list[str]:
    return random_texts(n, seed)


def embed_file(address: str, *args: str, **popen) -> subprocess.Popen:
    command = [
        *bertserve_command(),
        "embed-file",
        *args,
        "--address",
        address,
        "--model",
        MODEL,
        "--truncate",
    ]
    return subprocess.Popen(command, cwd=ROOT, text=True, **popen)


def unary_rows(address: str, texts: list[str], rows: np.ndarray) -> np.ndarray:
    chosen = [texts[i] for i in rows]
    with Client(address, timeout=60) as client:
        return np.concatenate(
            [
                client.embed(chosen[i : i + 256], model=MODEL, truncate=True).vectors
                for i in range(0, len(chosen), 256)
            ]
        )


def inputs_embedded(url: str) -> float:
    return metric(scrape(url), "bertserve_inputs_total", model=MODEL, task="embed")


def test_killed_job_resumes_without_recomputing_and_matches_unary_embed(tiny_server, tmp_path):
    texts = corpus(LINES)
    corpus_text = "".join(t + "\n" for t in texts)
    out = tmp_path / "vectors.npy"
    first = embed_file(
        tiny_server.address, "-", "--out", str(out), "--progress-every", "0",
        stdin=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    first.stdin.write("".join(t + "\n" for t in texts[: LINES // 2]))  # and no end of input yet
    first.stdin.flush()
    for line in first.stderr:  # a progress line per batch written
        if line.startswith("embed-file: ") and int(line.split()[1].split("/")[0]) >= KILL_AFTER_ROWS:
            break
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    first.stdin.close()
    first.stderr.close()
    state = json.loads((tmp_path / "vectors.npy.part.json").read_text())
    done = state["rows"]
    assert KILL_AFTER_ROWS <= done <= LINES // 2 and not out.exists()

    before = inputs_embedded(tiny_server.metrics_url)
    second = embed_file(
        tiny_server.address, "-", "--out", str(out), stdin=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = second.communicate(corpus_text, timeout=120)
    assert second.returncode == 0, err
    assert f"resuming after {done} rows" in err
    # only the rows not written before the kill were sent again
    assert inputs_embedded(tiny_server.metrics_url) - before == LINES - done
    assert not (tmp_path / "vectors.npy.part.json").exists()

    vectors = np.load(out)
    assert vectors.dtype == np.float32 and vectors.shape[0] == LINES
    rng = np.random.default_rng(0)
    sample = np.unique(
        np.concatenate([rng.integers(0, LINES, 200), np.arange(done - 3, done + 3), [LINES - 1]])
    )
    assert np.abs(vectors[sample] - unary_rows(tiny_server.address, texts, sample)).max() <= 1e-6


def test_json_lines_in_and_out_with_a_progress_bar_on_a_terminal(tiny_server, tmp_path):
    texts = corpus(300, seed=5)
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "vectors.jsonl"
    terminal, terminal_side = pty.openpty()
    fcntl.ioctl(terminal_side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    job = embed_file(
        tiny_server.address, str(source), "--field", "text", "--out", str(out), "--batch-size", "16",
        stderr=terminal_side,
    )  # fmt: skip
    os.close(terminal_side)
    shown = b""
    while True:  # until the child closes the terminal
        try:
            chunk = os.read(terminal, 4096)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    assert job.wait(60) == 0, shown.decode(errors="replace")
    os.close(terminal)
    bar = shown.decode(errors="replace")
    assert "inputs/s" in bar and "300/300" in bar

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(300))
    vectors = np.array([r["embedding"] for r in rows], dtype=np.float32)
    assert np.abs(vectors - unary_rows(tiny_server.address, texts, np.arange(300))).max() <= 1e-6


def test_failures_name_the_line_and_keep_the_progress(tiny_server, tmp_path):
    texts = corpus(200, seed=7)
    texts[150] = "   "
    source = tmp_path / "texts.txt"
    source.write_text("".join(t + "\n" for t in texts))
    out = tmp_path / "vectors.npy"
    job = embed_file(
        tiny_server.address, str(source), "--out", str(out), "--batch-size", "10", stderr=subprocess.PIPE
    )
    _, err = job.communicate(timeout=60)
    assert job.returncode == 1
    assert "INVALID_ARGUMENT: input line 151: empty" in err
    state = json.loads((tmp_path / "vectors.npy.part.json").read_text())
    assert state["rows"] == 150 and "run the same command to resume" in err  # every batch before the bad one

    # a changed input is refused on resume (its first rows no longer match), other options too
    changed = tmp_path / "changed.txt"
    changed.write_text("".join(t + "\n" for t in ["another text", *texts[1:]]))
    job = embed_file(tiny_server.address, str(changed), "--out", str(out), stderr=subprocess.PIPE)
    assert job.communicate(timeout=60)[1].count("differ from those already embedded") == 1
    assert job.returncode == 1
    job = embed_file(
        tiny_server.address, str(source), "--out", str(out), "--no-normalize", stderr=subprocess.PIPE
    )
    assert "--restart" in job.communicate(timeout=60)[1] and job.returncode == 1

    # --restart starts over; with the empty line fixed the job completes
    texts[150] = "fixed"
    source.write_text("".join(t + "\n" for t in texts))
    job = embed_file(tiny_server.address, str(source), "--out", str(out), "--restart", stderr=subprocess.PIPE)
    _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert np.load(out).shape[0] == 200
    job = embed_file(tiny_server.address, str(source), "--out", str(out), stderr=subprocess.PIPE)
    assert "exists" in job.communicate(timeout=60)[1] and job.returncode == 1


@pytest.mark.parametrize("suffix", [".parquet", ""])
def test_an_unknown_output_format_is_refused(tiny_server, tmp_path, suffix):
    job = embed_file(
        tiny_server.address,
        "-",
        "--out",
        str(tmp_path / f"v{suffix}"),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert ".npy or .jsonl" in job.communicate(timeout=60)[1] and job.returncode == 2
