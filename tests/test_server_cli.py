"""The `bertserve` command line (help, inputs from standard input, typed JSON), the typed client results
against the protocol, and the tasks' numerics."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import subprocess
import sys
import typing

import numpy as np
import pytest

from bertserve import client_results
from bertserve.cli import COMMAND_MODULES, build_parser, main
from bertserve.service.engine.tasks.classify import label_scores, ranked
from bertserve.service.engine.tasks.embed import finish_embeddings
from bertserve.service.engine.tasks.fill_mask import top_k
from bertserve.v1 import inference_pb2 as pb


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_client_commands(tiny_server, capsys):
    address = ["--address", tiny_server.address]
    assert main(["fill-mask", *address, "--top-k", "2", "the [MASK] sat"]) == 0
    assert "token 2:" in capsys.readouterr().out
    assert main(["tokenize", *address, "--model", "tiny-embed", "a cat"]) == 0
    assert "[CLS](" in capsys.readouterr().out
    assert main(["info", *address]) == 0
    assert "tiny-mlm v1" in capsys.readouterr().out
    assert main(["embed", *address, "--model", "nope", "x"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err


def test_json_output_is_complete_and_typed(tiny_server, capsys):
    address = ["--address", tiny_server.address]
    embedded = run_json(
        capsys, "embed", *address, "--model", "tiny-embed", "--no-normalize", "a cat", "a dog"
    )
    assert np.asarray(embedded["vectors"]).shape == (2, 48) and embedded["dimension"] == 48
    assert embedded["model"] == embedded["metadata"]["model"] == "tiny-embed"
    meta = embedded["metadata"]
    assert meta["model_version"] == 1 and isinstance(meta["model_version"], int)
    assert meta["truncated"] == [False, False] and meta["total_tokens"] == sum(meta["input_tokens"])
    assert set(meta) == {f.name for f in dataclasses.fields(client_results.Metadata)}
    tokens = run_json(capsys, "tokenize", *address, "--model", "tiny-embed", "a cat")["results"][0]["tokens"]
    assert tokens[0] == {"text": "[CLS]", "id": tokens[0]["id"], "start": 0, "end": 0, "special": True}
    assert tokens[1]["start"] == 0 and tokens[1]["end"] == 1 and tokens[1]["special"] is False
    assert run_json(capsys, "tokenize", *address, "a cat")["metadata"]["queue_time_ms"] == 0.0
    classified = run_json(capsys, "classify", *address, "--top-k", "1", "a cat")
    (label,) = classified["results"][0]["labels"]
    assert isinstance(label["index"], int) and 0 < label["score"] <= 1
    masks = run_json(capsys, "fill-mask", *address, "--top-k", "2", "the [MASK] sat")["results"][0]["masks"]
    assert masks[0]["position"] == 2 and len(masks[0]["candidates"]) == 2
    info = run_json(capsys, "info", *address)
    assert isinstance(info["limits"]["max_queue_inputs"], int) and "onnxruntime" in info["versions"]
    assert {m["name"] for m in info["models"]} >= {"tiny-embed", "tiny-mlm", "tiny-classifier"}


def test_dash_reads_inputs_from_standard_input(tiny_server, capsys, monkeypatch):
    address = ["--address", tiny_server.address, "--model", "tiny-embed"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("a cat sat\n\n  \nthe dog barked\n"))
    embedded = run_json(capsys, "embed", *address, "first", "-")
    assert len(embedded["vectors"]) == 3  # blank lines skipped; `-` expands in place
    monkeypatch.setattr(sys, "stdin", io.StringIO("a cat sat\n"))
    assert main(["tokenize", *address, "-"]) == 0
    assert capsys.readouterr().out.startswith("'a cat sat': [CLS](")
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert main(["embed", *address, "-"]) == 2
    assert "no inputs" in capsys.readouterr().err


def _subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    parsers = {}
    for module in COMMAND_MODULES:
        parser = build_parser(only_module=module)
        (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parsers.update(
            {name: sub for name, sub in subparsers.choices.items() if name in COMMAND_MODULES[module]}
        )
    return parsers


def test_every_option_of_every_subcommand_has_help_and_its_choices():
    from bertserve.commands.serve import SETTING_HELP
    from bertserve.service.settings import Settings

    parsers = _subcommand_parsers()
    assert set(parsers) == {command for commands in COMMAND_MODULES.values() for command in commands}
    for command, parser in parsers.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help.strip(), f"bertserve {command} {action.dest}: no help"
    serve = {action.dest: action for action in parsers["serve"]._actions}
    for name, field in Settings.model_fields.items():
        assert name == "models" or field.description or name in SETTING_HELP, f"setting {name} has no help"
        flag = serve[name]
        assert f"env BERTSERVE_{name.upper()}" in flag.help, name
        default = field.get_default(call_default_factory=True)
        shown = "unset" if default is None else "every model in the repository" if default == [] else default
        assert f"default: {shown}" in flag.help, name
        if typing.get_origin(field.annotation) is typing.Literal:
            assert tuple(flag.choices) == typing.get_args(field.annotation), name
    assert tuple(serve["precision"].choices) == ("fp32", "int8", "fp16")
    assert tuple(serve["provider"].choices) == ("auto", "cpu", "cuda")


@pytest.mark.parametrize("command", [c for commands in COMMAND_MODULES.values() for c in commands])
def test_every_command_prints_its_help(command, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([command, "--help"])
    assert stopped.value.code == 0 and "usage:" in capsys.readouterr().out


def test_serve_rejects_a_value_outside_the_choices(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["serve", "--precision", "fp8"])
    assert stopped.value.code == 2 and "fp32" in capsys.readouterr().err


def test_top_level_help_describes_each_command_without_importing_torch_or_grpc():
    script = (
        "import sys\n"
        "from bertserve.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('IMPORTED', sorted(m for m in ('torch', 'grpc', 'onnxruntime') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "IMPORTED []" in result.stdout
    for commands in COMMAND_MODULES.values():
        for command, description in commands.items():
            assert description in " ".join(result.stdout.split()), command
    assert "--help`" not in result.stdout


# Typed results: (dataclass, protobuf message, fields the dataclass adds, {proto field: its name here}).
RESULT_TYPES = [
    (client_results.Metadata, pb.ResponseMetadata, set(), {}),
    # the embedding options' outputs are unpacked from each Embedding into arrays per call
    (
        client_results.Embeddings,
        pb.EmbedResponse,
        {"model", "encodings", "tokens", "sparse", "chunks"},
        {"embeddings": "vectors"},
    ),
    (client_results.MaskCandidate, pb.MaskCandidate, set(), {}),
    (client_results.MaskPrediction, pb.MaskPrediction, set(), {}),
    (client_results.FillMaskResult, pb.FillMaskResult, set(), {}),
    (client_results.FilledMasks, pb.FillMaskResponse, {"model"}, {}),
    (client_results.LabelScore, pb.LabelScore, set(), {}),
    (client_results.Classification, pb.Classification, set(), {}),
    (client_results.Classifications, pb.ClassifyResponse, {"model"}, {}),
    (client_results.Token, pb.Token, set(), {}),
    (client_results.TokenizedInput, pb.TokenizedInput, set(), {}),
    (client_results.Tokenization, pb.TokenizeResponse, {"model"}, {}),
    (client_results.AttentionMap, pb.AttentionMap, set(), {}),
    (client_results.AttentionMaps, pb.AttentionResponse, {"model"}, {}),
    (client_results.ModelInfo, pb.ModelInfo, set(), {}),
    (client_results.Limits, pb.Limits, set(), {}),
    (client_results.ServerInfo, pb.InfoResponse, set(), {}),
]


@pytest.mark.parametrize(
    ("result", "message", "added", "renamed"), RESULT_TYPES, ids=lambda t: getattr(t, "__name__", "")
)
def test_typed_results_carry_every_field_of_the_protocol(result, message, added, renamed):
    """A field added to the protocol fails here until the client's results carry it."""
    protocol = {renamed.get(f.name, f.name) for f in message.DESCRIPTOR.fields}
    assert {f.name for f in dataclasses.fields(result)} == protocol | added


def test_typed_results_from_a_reply():
    reply = pb.EmbedResponse(
        dimension=2, metadata=pb.ResponseMetadata(model="m", model_version=3, input_tokens=[4])
    )
    reply.embeddings.add(values=[0.5, -1.0])
    result = client_results.embeddings(reply)
    assert result.vectors.dtype == np.float32 and result.vectors.tolist() == [[0.5, -1.0]]
    assert (result.model, result.dimension, result.metadata.model_version, result.metadata.input_tokens) == (
        "m",
        2,
        3,
        [4],
    )
    attention = pb.AttentionResponse(sequence_length=2, metadata=pb.ResponseMetadata(model="m"))
    attention.maps.add(layer=1, head=0, probabilities=[1.0, 0.0, 0.25, 0.75])
    maps = client_results.attention_maps(attention)
    assert maps.matrix(1, 0).tolist() == [[1.0, 0.0], [0.25, 0.75]]
    with pytest.raises(KeyError, match="layer 0 head 0"):
        maps.matrix(0, 0)
    assert maps.to_dict()["maps"][0]["probabilities"] == [[1.0, 0.0], [0.25, 0.75]]


def test_the_readme_client_example_runs(tiny_server, capsys):
    """The Python block of the README's "Calling it" section, against the tiny server."""
    from tests.helpers.server import ROOT

    section = (ROOT / "README.md").read_text().split("\n## Calling it", 1)[1].split("\n## ", 1)[0]
    (code,) = [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]
    assert "from bertserve.client import Client" in code
    exec(compile(code.replace("127.0.0.1:50051", tiny_server.address), "README.md", "exec"), {})
    model, total_tokens, _ = capsys.readouterr().out.split()
    assert model.startswith("tiny-") and int(total_tokens) > 0  # the server's default model for Embed


def test_task_numerics():
    logits = np.array([[1.0, 3.0, 3.0, -2.0]])
    ids, scores = top_k(logits, 3)
    assert ids.tolist() == [[1, 2, 0]]  # ties broken by the lower id
    expected = np.exp(logits) / np.exp(logits).sum()
    assert np.allclose(scores, expected[0, [1, 2, 0]])
    sigmoid = label_scores(np.array([0.0, 2.0]), "multi_label_classification", raw_scores=False)
    assert np.allclose(sigmoid, 1 / (1 + np.exp(-np.array([0.0, 2.0]))))
    assert np.allclose(label_scores(np.array([0.5, -1.0]), "single_label_classification", True), [0.5, -1.0])
    assert ranked(np.array([0.1, 0.7, 0.2], dtype=np.float32), 2) == [
        (1, np.float32(0.7)),
        (2, np.float32(0.2)),
    ]
    vectors = finish_embeddings(np.array([[3.0, 4.0], [3.0, 4.0]], np.float32), np.array([True, False]))
    assert np.allclose(vectors, [[0.6, 0.8], [3.0, 4.0]])
