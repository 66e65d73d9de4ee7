"""The default reranker (train/heads/rerank_*.py; weights: export/heads/weights/reranker.*): its data (the
held-out synsets never reach training), its figures, the committed weights' checksum, and the assembled
checkpoint: a sentence-transformers CrossEncoder that ranks held-out pairs, equal in transformers, our
scratch BERT and ONNX Runtime after `bertserve export`. No training here (`make train-reranker` trains)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from bertserve.export.default_model import DEFAULT_MODEL_NAME
from bertserve.train.heads.rerank_data import parse_sense
from bertserve.train.heads.rerank_metrics import Bm25, rank_of_relevant, ranking_figures
from bertserve.train.heads.wordnet import split_of, wordnet_dir

needs_wordnet = pytest.mark.skipif(
    not (wordnet_dir() / "data.noun").is_file(),
    reason="WordNet not installed (Debian: apt-get install wordnet-base)",
)

# data.noun's line of dog, pointers shortened: two hypernyms, a member holonym, two hyponyms.
DOG_LINE = (
    "02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 005 @ 02083346 n 0000 @ 01317541 n 0000 "
    "#m 02083863 n 0000 ~ 01322604 n 0000 ~i 02084732 n 0000 | a member of the genus Canis (probably "
    'descended from the common wolf) that has been domesticated; "the dog barked all night"  \n'
)

# Held-out synsets (WordNet 3.0 offset, query, its definition, the hardest definitions of its relatives in its
# held-out list), checked to be in the held-out split below; two of the lists the model ranks right.
HELD_OUT = [
    (
        597821,
        "proconsulship, proconsulate",
        "the position of proconsul",
        ["the position of trustee", "the position of apprentice", "the position of a khan"],
    ),
    (
        875838,
        "value judgment, value judgement",
        "an assessment that reveals more about the values of the person making the assessment than about the "
        "reality of what is assessed",
        [
            "a judgment of the qualities of something or somebody",
            "judgment involved in the determination of rights and the assignment of rewards and punishments",
            "judgments about another person's morality",
        ],
    ),
]


def test_parse_sense_reads_hypernyms_and_hyponyms():
    sense = parse_sense(DOG_LINE)
    assert sense.offset == 2084071 and sense.words == ("dog", "domestic dog", "Canis familiaris")
    assert sense.hypernyms == (2083346, 1317541)
    assert sense.hyponyms == (1322604, 2084732)  # ~ and ~i; the member holonym is neither
    assert sense.examples == ("the dog barked all night",)


def test_rank_counts_higher_scores_and_earlier_ties():
    scores = np.array([0.5, 0.9, 0.5, 0.1])
    assert rank_of_relevant(scores, 1) == 1
    assert rank_of_relevant(scores, 0) == 2  # after 0.9; the tie at index 2 comes later
    assert rank_of_relevant(scores, 2) == 3  # after 0.9 and the earlier tie
    figures = ranking_figures([scores, scores], [1, 2])
    assert figures["mrr@10"] == pytest.approx((1 + 1 / 3) / 2)
    assert figures["ndcg@10"] == pytest.approx((1 + 1 / np.log2(4)) / 2)
    assert ranking_figures([np.arange(12.0)], [0])["mrr@10"] == 0.0  # rank 12: past the cutoff


def test_bm25_prefers_the_document_with_the_rarer_shared_word():
    bm25 = Bm25(["a small dog", "a small cat", "a small house", "a large dog kennel"])
    scores = bm25.scores("small dog", ["a small house", "a dog kennel", "nothing shared"])
    assert scores[1] > scores[0] > scores[2] == 0.0


@needs_wordnet
def test_no_held_out_synset_reaches_training():
    from bertserve.train.heads.rerank_data import ListSizes, Relations, build_lists, load_senses

    senses = load_senses()
    relations = Relations(senses)
    train = build_lists(relations, "train", ListSizes(queries=300, candidates=8, hard=5, seed=1))
    test = build_lists(relations, "test", ListSizes(queries=100, candidates=20, hard=12, seed=2))
    train_texts = {s.definition for o, s in senses.items() if split_of(o) == "train"}
    held_out_only = {s.definition for o, s in senses.items() if split_of(o) == "test"} - train_texts
    assert all(split_of(item.offset) == "train" for item in train)
    trained = frozenset(item.offset for item in train)
    calibration = build_lists(
        relations, "train", ListSizes(queries=300, candidates=20, hard=12, seed=3), 10, trained
    )
    assert len(calibration) == 300 and not {item.offset for item in calibration} & trained
    assert not {d for item in train for d in item.documents} & held_out_only
    assert not {item.query for item in train} & {item.query for item in test}
    for item in test:
        assert split_of(item.offset) == "test" and len(item.documents) == 20
        assert item.documents[item.relevant] == senses[item.offset].definition


@pytest.fixture(scope="module")
def record():
    from bertserve.export.heads.assemble import COMMITTED_HEADS_DIR
    from bertserve.export.heads.reranker import RECORD_FILE, verify_weights

    if not (COMMITTED_HEADS_DIR / RECORD_FILE).is_file():
        pytest.skip("no committed reranker weights: make train-reranker")
    return verify_weights(COMMITTED_HEADS_DIR)  # raises when reranker.safetensors' sha256 differs


def test_committed_reranker_figures_are_recorded_and_its_served_score_beats_both_baselines(record):
    """What the committed record shows (docs/reranker.md): the cross-encoder alone is measured, and the
    score the server gives (its logit plus MiniLM's cosine, fitted on training-split lists whose queries
    the cross-encoder never trained on) beats BM25 and the cosine on the held-out lists."""
    from bertserve.export.heads.reranker import beats_baselines, fusion_of

    chosen = record["variants"][str(record["chosen_layers"])]
    fusion = record["fusion"]
    assert record["data"]["test"]["lists"] >= 300 and record["data"]["test"]["candidates"] == 20
    assert fusion["fit"]["split"].startswith("train") and fusion["fit"]["lists"] >= 300
    assert fusion_of(record).embedding_model == DEFAULT_MODEL_NAME
    assert fusion["cosine_weight"] > 0 and fusion["logit_weight"] > 0
    assert beats_baselines(record) is None
    fused = fusion["held_out"]["fused"]
    for metric in ("mrr@10", "ndcg@10"):
        assert chosen[metric] > record["baselines"]["bm25"][metric] + 0.05
        assert fused[metric] > record["baselines"]["cosine"][metric] > 0
    assert fused["mrr@10_minus_cosine"] > fused["paired_standard_error"] > 0


def test_altered_weights_are_refused(record, tmp_path):
    from bertserve.export.default_model import default_checkpoint_dir
    from bertserve.export.heads.assemble import COMMITTED_HEADS_DIR, HeadsError
    from bertserve.export.heads.reranker import RECORD_FILE, WEIGHTS_FILE, assemble_reranker

    for name in (WEIGHTS_FILE, RECORD_FILE):
        shutil.copyfile(COMMITTED_HEADS_DIR / name, tmp_path / name)
    data = bytearray((tmp_path / WEIGHTS_FILE).read_bytes())
    data[-1] ^= 1
    (tmp_path / WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(HeadsError, match="sha256"):
        assemble_reranker(default_checkpoint_dir(), tmp_path, tmp_path / "out")


def _record(chosen_mrr: float, cosine_mrr: float, fused_mrr: float | None = None) -> dict:
    figures = {"mrr@10": chosen_mrr, "ndcg@10": chosen_mrr}
    record = {
        "chosen_layers": 1,
        "variants": {"0": {"mrr@10": 0.1, "ndcg@10": 0.1}, "1": figures},
        "baselines": {
            "bm25": {"mrr@10": 0.2, "ndcg@10": 0.2},
            "cosine": {"mrr@10": cosine_mrr, "ndcg@10": cosine_mrr},
        },
    }
    if fused_mrr is not None:
        fused = {"mrr@10": fused_mrr, "ndcg@10": fused_mrr}
        weights = {
            "embedding_model": DEFAULT_MODEL_NAME,
            "cosine_weight": 4.0,
            "logit_weight": 0.5,
            "bias": -3.0,
        }
        record["fusion"] = weights | {"held_out": {"fused": fused, "cross_encoder": figures}}
    return record


def test_export_default_takes_the_reranker_only_when_it_beats_both_baselines(tmp_path):
    from bertserve.export.default_heads import reranker_models
    from bertserve.export.heads.reranker import RERANKER_NAME, save_weights

    lines = []
    assert reranker_models(tmp_path, log=lines.append) == [] and "no trained weights" in lines[-1]
    state = {"classifier.weight": torch.zeros(1, 4, dtype=torch.float16)}
    save_weights(tmp_path, state, _record(chosen_mrr=0.7, cosine_mrr=0.6))
    models = reranker_models(tmp_path, log=lines.append)
    assert [m.name for m in models] == [RERANKER_NAME] and not models[0].on_encoder
    save_weights(tmp_path, state, _record(chosen_mrr=0.5, cosine_mrr=0.6))
    assert reranker_models(tmp_path, log=lines.append) == []
    assert "mrr@10 0.5000 is not above cosine's 0.6000" in lines[-1]
    # with a fusion the served score is the fused one: it decides, and the model carries the fusion
    save_weights(tmp_path, state, _record(chosen_mrr=0.5, cosine_mrr=0.6, fused_mrr=0.65))
    (model,) = reranker_models(tmp_path, log=lines.append)
    assert model.fusion.embedding_model == DEFAULT_MODEL_NAME and model.fusion.cosine_weight == 4.0
    save_weights(tmp_path, state, _record(chosen_mrr=0.7, cosine_mrr=0.6, fused_mrr=0.55))
    assert reranker_models(tmp_path, log=lines.append) == []
    assert "mrr@10 0.5500 is not above cosine's 0.6000" in lines[-1]


@pytest.fixture(scope="module")
def assembled(tmp_path_factory, record):
    from bertserve.cli import main

    out = tmp_path_factory.mktemp("reranker") / "wordnet-reranker"
    assert main(["assemble-reranker", "--out", str(out)]) == 0
    return out


def _held_out_pairs() -> tuple[list[tuple[str, str]], list[int]]:
    """All (query, document) pairs of HELD_OUT, and the index of each case's first pair."""
    assert HELD_OUT, "pick the cases from the held-out lists after `make train-reranker`"
    pairs, starts = [], []
    for offset, query, relevant, negatives in HELD_OUT:
        assert split_of(offset) == "test", offset
        starts.append(len(pairs))
        pairs += [(query, relevant)] + [(query, n) for n in negatives]
    return pairs, starts


def test_assembled_reranker_is_a_cross_encoder_that_ranks_held_out_pairs(assembled):
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer, BertForSequenceClassification

    from bertserve.export.checkpoint import load_checkpoint

    pairs, starts = _held_out_pairs()
    reference, info = BertForSequenceClassification.from_pretrained(assembled, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert reference.config.num_labels == 1
    batch = AutoTokenizer.from_pretrained(assembled)(
        [q for q, _ in pairs], [d for _, d in pairs], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        logits = reference.eval()(**batch).logits[:, 0]
        ours = load_checkpoint(assembled).model(**batch)[:, 0]
    torch.testing.assert_close(ours, logits, atol=1e-4, rtol=1e-4)

    cross_encoder = CrossEncoder(str(assembled), device="cpu")
    assert isinstance(cross_encoder.activation_fn, torch.nn.Sigmoid)
    scores = cross_encoder.predict(pairs)
    np.testing.assert_allclose(scores, torch.sigmoid(logits).numpy(), atol=1e-4)
    for start, stop in zip(starts, [*starts[1:], len(pairs)], strict=True):
        assert scores[start] > scores[start + 1 : stop].max(), pairs[start][0]


@pytest.fixture(scope="module")
def served_repo(assembled, record, default_repo, tmp_path_factory):
    """The default repository's MiniLM and the reranker exported beside it with the record's fusion."""
    from bertserve.export.heads.reranker import RERANKER_NAME, fusion_of
    from bertserve.export.pipeline import export_model

    repo = tmp_path_factory.mktemp("served") / "repo"
    shutil.copytree(default_repo, repo)
    export_model(assembled, repo, name=RERANKER_NAME, version=1, fusion=fusion_of(record), log=lambda _: None)
    return repo


def _logits(assembled, pairs):
    """The tokenized pairs (numpy) and transformers' logit of each."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    batch = AutoTokenizer.from_pretrained(assembled)(
        [q for q, _ in pairs], [d for _, d in pairs], padding=True, return_tensors="np"
    )
    with torch.no_grad():
        model = BertForSequenceClassification.from_pretrained(assembled).eval()
        logits = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits[:, 0].numpy()
    return batch, logits


def test_assembled_reranker_exports_and_scores_through_onnx_runtime(assembled, served_repo):
    import onnxruntime as ort

    from bertserve.export.heads.reranker import RERANKER_NAME
    from bertserve.manifest import CLASSIFIER_HEAD, ENCODER, Manifest

    version_dir = served_repo / RERANKER_NAME / "1"
    manifest = Manifest.read(version_dir)
    assert len(manifest.tasks.classify.id2label) == 1
    pairs, _ = _held_out_pairs()
    batch, expected = _logits(assembled, pairs)
    encoder = ort.InferenceSession(str(version_dir / manifest.graphs[ENCODER].file))
    head = ort.InferenceSession(str(version_dir / manifest.graphs[CLASSIFIER_HEAD].file))
    feeds = {i.name: batch[i.name] for i in encoder.get_inputs()}
    classifier_input = head.get_inputs()[0].name
    logits = head.run(["logits"], {classifier_input: encoder.run([classifier_input], feeds)[0]})[0][:, 0]
    np.testing.assert_allclose(logits, expected, atol=1e-4)


def test_served_default_reranker_adds_minilm_cosine_and_ranks_held_out_lists(assembled, record, served_repo):
    """Rerank with no model named, on the server: the reranker's logit plus MiniLM's cosine (its Score),
    as the record's fusion weighs them, within 1e-4; the relevant definition of each held-out case first."""
    import grpc

    from bertserve.export.heads.reranker import RERANKER_NAME
    from bertserve.v1 import inference_pb2 as pb
    from bertserve.v1 import inference_pb2_grpc as pb_grpc
    from tests.helpers.server import ServerThread

    pairs, starts = _held_out_pairs()
    _, logits = _logits(assembled, pairs)
    fusion = record["fusion"]
    server = ServerThread(model_repo=served_repo, max_queue_delay_ms=5)
    with server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        for start, stop in zip(starts, [*starts[1:], len(pairs)], strict=True):
            query, documents = pairs[start][0], [d for _, d in pairs[start:stop]]
            cosines = stub.Score(
                pb.ScoreRequest(texts_1=[query], texts_2=documents, model=DEFAULT_MODEL_NAME), timeout=60
            )
            linear = fusion["logit_weight"] * logits[start:stop] + fusion["bias"]
            linear += fusion["cosine_weight"] * np.array([r.score for r in cosines.results])
            response = stub.Rerank(pb.RerankRequest(query=query, documents=documents), timeout=60)
            assert response.method == "cross_encoder+cosine" and response.metadata.model == RERANKER_NAME
            got = {r.index: r.score for r in response.results}
            expected = 1 / (1 + np.exp(-linear))
            np.testing.assert_allclose([got[i] for i in range(len(documents))], expected, atol=1e-4)
            assert response.results[0].index == 0, query


def test_training_reports_progress_without_changing_the_run():
    """`progress` runs every `every` batches, counted over all epochs, in eval mode; the training after it
    is the same as without it (dropout back on, no random numbers drawn), so a learning curve in the log
    costs nothing in results."""
    from bertserve.export.model import BertConfig, BertModel
    from bertserve.train.heads.rerank_model import HiddenStates, RerankTraining, TopModel, train_top

    torch.manual_seed(0)
    config = BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    encoder = BertModel(config)
    states = HiddenStates([torch.randn(3 + i % 4, 16).half() for i in range(24)])  # 6 lists of 4
    training = RerankTraining(epochs=2, lists_per_batch=2, warmup_fraction=0.5)

    def trained(every: int) -> tuple[list, dict]:
        seen = []
        torch.manual_seed(1)
        model = TopModel(encoder, 1, dropout=0.5)

        def progress(batches: int) -> None:
            assert not model.training
            seen.append(batches)

        train_top(model, states, 4, training, lambda _: None, progress, every)
        return seen, model.trained_state()

    seen, with_progress = trained(every=2)
    assert seen == [2, 4, 6]
    _, without = trained(every=0)
    for name, tensor in without.items():
        torch.testing.assert_close(with_progress[name], tensor, rtol=0, atol=0)
