"""`bertserve embed-file` (bertserve/commands/embed_file.py) as a subprocess against a real server: vectors
equal to unary Embed, resume after SIGKILL or Ctrl-C without recomputing, JSON Lines in and out, a
progress bar on a terminal, lines that end at \n only, bad lines failed on (one line naming them, resumable
once fixed) or skipped (NaN rows, listed), texts over max_input_chars cut with --truncate."""

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
from tests.helpers.server import ROOT, bertserve_command, metric, scrape, taking_sigint, wait_for
from tests.helpers.texts import random_texts

MODEL = "tiny-embed"
LINES = 5_000
KILL_AFTER_ROWS = 1_000  # the first run is killed once this many rows are written (of LINES // 2 fed)


def corpus(n: int, seed: int = 11) -> list[str]:
    return random_texts(n, seed)


def embed_file(
    address: str, *args: str, truncate: bool = True, sigint: bool = False, **popen
) -> subprocess.Popen:
    """`bertserve embed-file ARGS` as a subprocess; `sigint`: it takes Ctrl-C (`taking_sigint`)."""
    command = [*bertserve_command(), "embed-file", *args, "--address", address, "--model", MODEL]
    if truncate:
        command.append("--truncate")
    return subprocess.Popen(taking_sigint(command) if sigint else command, cwd=ROOT, text=True, **popen)


def finish(job: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    """Its exit code and standard error."""
    _, err = job.communicate(timeout=timeout)
    return job.returncode, err


def unary_rows(address: str, texts: list[str], rows) -> np.ndarray:
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

    # the killed job's stream ends on the server before counting: its last request may still be computing
    wait_for(lambda: metric(scrape(tiny_server.metrics_url), "bertserve_streams_open") == 0)
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


def test_a_bad_line_stops_the_job_in_one_line_and_it_resumes_once_fixed(tiny_server, tmp_path):
    texts = corpus(200, seed=7)
    texts[150] = "   "
    source = tmp_path / "texts.txt"
    source.write_text("".join(t + "\n" for t in texts))
    out = tmp_path / "vectors.npy"
    for _ in range(2):  # the same command, with the line still bad, stops at the same line
        job = embed_file(
            tiny_server.address, str(source), "--out", str(out), "--batch-size", "10", stderr=subprocess.PIPE
        )
        code, err = finish(job)
        told = [line for line in err.splitlines() if not line.startswith("embed-file: resuming after 150")]
        assert code == 1 and len(told) == 1, err  # one line, no traceback
        assert f"{source} line 151: empty or whitespace-only text" in err and "--on-bad-line skip" in err
        state = json.loads((tmp_path / "vectors.npy.part.json").read_text())
        assert state["rows"] == 150 and "run the same command to resume" in err  # every line before it

    # a changed input is refused on resume (its first rows no longer match), other options too
    changed = tmp_path / "changed.txt"
    changed.write_text("".join(t + "\n" for t in ["another text", *texts[1:]]))
    job = embed_file(tiny_server.address, str(changed), "--out", str(out), stderr=subprocess.PIPE)
    code, err = finish(job)
    assert err.count("differ from those already done") == 1 and code == 1
    job = embed_file(
        tiny_server.address, str(source), "--out", str(out), "--no-normalize", stderr=subprocess.PIPE
    )
    code, err = finish(job)
    assert "--restart" in err and code == 1

    # with the line fixed, the same command resumes there and completes
    texts[150] = "fixed"
    source.write_text("".join(t + "\n" for t in texts))
    before = inputs_embedded(tiny_server.metrics_url)
    code, err = finish(
        embed_file(tiny_server.address, str(source), "--out", str(out), stderr=subprocess.PIPE)
    )
    assert code == 0 and "resuming after 150 rows" in err, err
    assert inputs_embedded(tiny_server.metrics_url) - before == 50
    vectors = np.load(out)
    assert vectors.shape[0] == 200 and not (tmp_path / "vectors.npy.skipped.jsonl").exists()
    rows = [0, 149, 150, 199]
    assert np.abs(vectors[rows] - unary_rows(tiny_server.address, texts, rows)).max() <= 1e-6
    code, err = finish(
        embed_file(tiny_server.address, str(source), "--out", str(out), stderr=subprocess.PIPE)
    )
    assert "exists" in err and code == 1

    # --restart starts over
    texts[150] = "  "
    source.write_text("".join(t + "\n" for t in texts))
    out.unlink()
    assert (
        finish(embed_file(tiny_server.address, str(source), "--out", str(out), stderr=subprocess.PIPE))[0]
        == 1
    )
    before = inputs_embedded(tiny_server.metrics_url)
    code, err = finish(
        embed_file(tiny_server.address, str(source), "--out", str(out), "--restart", stderr=subprocess.PIPE)
    )
    assert code == 1 and "resuming" not in err and inputs_embedded(tiny_server.metrics_url) - before == 150


def test_a_lone_carriage_return_stays_in_its_line(tiny_server, tmp_path):
    """Lines end at \\n only: a \\r inside a line is text; the \\r of a \\r\\n goes with the line end."""
    source = tmp_path / "texts.txt"
    source.write_bytes(b"the cat sat\nthe dog\rbarked at the mat\nin paris\r\nthe river bank")
    out = tmp_path / "vectors.jsonl"
    code, err = finish(
        embed_file(tiny_server.address, str(source), "--out", str(out), stderr=subprocess.PIPE)
    )
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2, 3]  # 4 lines, 4 rows
    texts = ["the cat sat", "the dog\rbarked at the mat", "in paris", "the river bank"]
    vectors = np.array([r["embedding"] for r in rows], dtype=np.float32)
    assert np.abs(vectors - unary_rows(tiny_server.address, texts, range(4))).max() <= 1e-6


def test_bad_lines_skipped_keep_the_rows_aligned_with_the_lines(tiny_server, tmp_path):
    with Client(tiny_server.address, timeout=30) as client:
        max_chars = client.info().limits.max_input_chars
    lines = [
        b"the cat sat",
        b"caf\xe9 au lait",  # Latin-1, not UTF-8
        b"",
        b"  \t ",
        b"the " + b"dog " * (max_chars // 4 + 1),  # over max_input_chars, and no --truncate
        b"a bell \x07 rang",  # a control character: refused by the server, not by the client
        b"on the mat",
    ]
    source = tmp_path / "texts.txt"
    source.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "vectors.npy"
    job = embed_file(
        tiny_server.address, str(source), "--out", str(out), "--on-bad-line", "skip", "--batch-size", "2",
        truncate=False, stderr=subprocess.PIPE,
    )  # fmt: skip
    code, err = finish(job)
    assert code == 0, err
    assert "5 lines skipped" in err
    vectors = np.load(out)
    assert vectors.shape[0] == len(lines)
    bad = [1, 2, 3, 4, 5]
    assert np.isnan(vectors[bad]).all() and not np.isnan(vectors[[0, 6]]).any()
    expected = unary_rows(tiny_server.address, [lines[0].decode(), lines[6].decode()], [0, 1])
    assert np.abs(vectors[[0, 6]] - expected).max() <= 1e-6
    skipped = [json.loads(line) for line in (tmp_path / "vectors.npy.skipped.jsonl").read_text().splitlines()]
    assert [s["line"] for s in skipped] == [2, 3, 4, 5, 6]
    reasons = [s["reason"] for s in skipped]
    assert "not UTF-8" in reasons[0] and "empty" in reasons[1] and "empty" in reasons[2]
    assert f"max_input_chars {max_chars}" in reasons[3] and "control character U+0007" in reasons[4]

    # the same as JSON Lines out: the row is null, with its reason
    out = tmp_path / "vectors.jsonl"
    job = embed_file(
        tiny_server.address, str(source), "--out", str(out), "--on-bad-line", "skip", truncate=False,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert finish(job)[0] == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(len(lines)))
    assert [r["embedding"] is None for r in rows] == [i in bad for i in range(len(lines))]
    assert "not UTF-8" in rows[1]["skipped"]


def test_a_line_not_utf8_fails_naming_it_and_resumes_with_skip(tiny_server, tmp_path):
    source = tmp_path / "texts.txt"
    source.write_bytes(b"the cat\non the mat\n\xff\xfe the dog\nin paris\n")
    out = tmp_path / "vectors.npy"
    code, err = finish(
        embed_file(tiny_server.address, str(source), "--out", str(out), stderr=subprocess.PIPE)
    )
    assert code == 1 and len(err.splitlines()) == 1, err
    assert f"{source} line 3: not UTF-8 (byte 0xff at byte 0" in err
    job = embed_file(
        tiny_server.address, str(source), "--out", str(out), "--on-bad-line", "skip", stderr=subprocess.PIPE
    )
    code, err = finish(job)
    assert code == 0 and "resuming after 2 rows" in err, err
    vectors = np.load(out)
    assert vectors.shape[0] == 4 and np.isnan(vectors[2]).all() and not np.isnan(vectors[[0, 1, 3]]).any()


def test_truncate_cuts_texts_over_max_input_chars(tiny_server, tmp_path):
    with Client(tiny_server.address, timeout=30) as client:
        max_chars = client.info().limits.max_input_chars
    long_text = ("the cat sat on the mat " * (max_chars // 20 + 2)).strip()
    assert len(long_text) > max_chars
    texts = ["a dog", long_text, "paris"]
    source = tmp_path / "texts.txt"
    source.write_text("".join(t + "\n" for t in texts))
    out = tmp_path / "vectors.npy"
    code, err = finish(
        embed_file(tiny_server.address, str(source), "--out", str(out), stderr=subprocess.PIPE)
    )
    assert code == 0, err
    expected = unary_rows(tiny_server.address, ["a dog", long_text[:max_chars], "paris"], range(3))
    assert np.abs(np.load(out) - expected).max() <= 1e-6


def test_ctrl_c_ends_the_job_in_one_line_and_it_resumes(tiny_server, tmp_path):
    texts = corpus(2_000, seed=3)
    out = tmp_path / "vectors.npy"
    job = embed_file(
        tiny_server.address, "-", "--out", str(out), "--progress-every", "0",
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, sigint=True,
    )  # fmt: skip
    job.stdin.write("".join(t + "\n" for t in texts[:1_000]))  # and no end of input yet
    job.stdin.flush()
    for line in job.stderr:  # progress lines: the stream is running
        if line.startswith("embed-file: ") and int(line.split()[1].split("/")[0]) >= 200:
            break
    job.send_signal(signal.SIGINT)
    rest = job.stderr.read()
    assert job.wait(30) == 130
    job.stdin.close()
    assert "Traceback" not in rest
    last = [line for line in rest.splitlines() if not line.startswith("embed-file: ")]
    assert len(last) == 1 and last[0].startswith("bertserve embed-file: interrupted;"), rest
    assert "run the same command to resume" in last[0]
    done = json.loads((tmp_path / "vectors.npy.part.json").read_text())["rows"]
    assert done >= 200

    job = embed_file(
        tiny_server.address, "-", "--out", str(out), stdin=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = job.communicate("".join(t + "\n" for t in texts), timeout=120)
    assert job.returncode == 0 and f"resuming after {done} rows" in err, err
    assert np.load(out).shape[0] == len(texts)


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


def test_an_unknown_model_is_one_line_before_any_file_is_written(tiny_server, tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("the cat\n")
    out = tmp_path / "v.npy"
    command = [*bertserve_command(), "embed-file", str(source), "--out", str(out), "--model", "nope"]
    done = subprocess.run(
        [*command, "--address", tiny_server.address], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "no model named 'nope' is served" in done.stderr and "tiny-embed" in done.stderr
    assert not list(tmp_path.glob("v.npy*"))
