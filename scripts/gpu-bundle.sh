#!/usr/bin/env bash
# `make gpu-bundle`: what `make gpu-check` installs, gathered on a machine that reaches PyPI, for a GPU machine
# that reaches nothing (`scripts/gpu-check.sh --bundle DIR` there). Writes DIR/wheels (onnxruntime-gpu,
# bertserve and bertserve-bench, and everything they and the GPU bench import, for the target's Python on
# x86-64 Linux), DIR/model_repository (the exported default model, as `make export-default` left it) and
# DIR/native: the native gRPC transport and the bench's load generators built here, with the shared libraries
# they load beyond glibc's, the C++ runtime, OpenSSL's and zlib's (gRPC's, abseil's, re2's: a GPU image may
# have no compiler nor libgrpc++; the left-out ones it has, and they stay its own for its Python too); they
# match this checkout's sources, so the GPU machine runs the same commit.
# CUDA's and cuDNN's libraries are not in it: the target has them (NVIDIA's pip packages, as torch's CUDA build
# brings them, or a CUDA install), and torch is not needed (the GPU bench runs no PyTorch baseline).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL=all-minilm-l6-v2

usage() {
    cat <<'EOF'
usage: scripts/gpu-bundle.sh DIR [--python-version X.Y] [--repo DIR] [--pip PIP]

  DIR               where the bundle goes (made; its wheels/ is emptied first)
  --python-version  the GPU machine's Python (default: this machine's python3)
  --repo            the model repository holding all-minilm-l6-v2 (default model_repository)
  --pip             the pip to download with (default .venv/bin/pip, as `make setup` made it)
EOF
}

fail() {
    echo "gpu-bundle: $1" >&2
    exit 1
}

OUT="" VERSION="" REPO="${ROOT}/model_repository" PIP="${ROOT}/.venv/bin/pip"
while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --python-version | --repo | --pip)
            [ $# -ge 2 ] || fail "$1 needs a value (see --help)"
            case "$1" in
                --python-version) VERSION="$2" ;;
                --repo) REPO="$2" ;;
                --pip) PIP="$2" ;;
            esac
            shift 2 ;;
        -*) fail "unknown option $1 (see --help)" ;;
        *) [ -z "${OUT}" ] || fail "one DIR only (see --help)"; OUT="$1"; shift ;;
    esac
done
[ -n "${OUT}" ] || fail "name the bundle's DIR (see --help)"
VERSION="${VERSION:-$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')}"
[[ "${VERSION}" =~ ^3\.[0-9]+$ ]] || fail "--python-version ${VERSION}: give X.Y, e.g. 3.12"
[ -x "${PIP}" ] || fail "no ${PIP}: run make setup first (or pass --pip)"
models=("${REPO}/${MODEL}"/*/manifest.json)
[ -f "${models[0]}" ] || fail "no ${MODEL} in ${REPO}: run make export-default first (or pass --repo)"

rm -rf "${OUT}/wheels" "${OUT}/model_repository"
mkdir -p "${OUT}/wheels" "${OUT}/model_repository"
# the project's own wheels (pure Python), then what they and the GPU bench need, as binaries for the target
"${PIP}" wheel -q --no-deps --no-build-isolation -w "${OUT}/wheels" "${ROOT}" "${ROOT}/bench"
needs="$(cd "${ROOT}" && "$(dirname "${PIP}")/python" - <<'EOF'
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from setuptools._vendor import tomli as tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
runtime = [d for d in project["dependencies"] if not d.startswith("onnxruntime")]
print("\n".join(runtime + ["onnxruntime-gpu>=1.20", "onnx>=1.16", "psutil>=5.9", "matplotlib>=3.8"]))
EOF
)"
mapfile -t requirements <<<"${needs}"
platforms=()
for glibc in 2_17 2_27 2_28 2_34; do platforms+=(--platform "manylinux_${glibc}_x86_64"); done
"${PIP}" download -q --only-binary=:all: --implementation cp --python-version "${VERSION}" \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d "${OUT}/wheels" "${requirements[@]}" \
    || fail "pip download for Python ${VERSION} failed (above)"
cp -r "${REPO}/${MODEL}" "${OUT}/model_repository/"
rm -rf "${OUT}/native"
if (cd "${ROOT}" && "$(dirname "${PIP}")/python" -m bertserve.bench.gpu_check native "${OUT}/native" >/dev/null); then
    mkdir -p "${OUT}/native/lib"
    for built in "${OUT}"/native/bertserve-*; do ldd "${built}"; done | awk '/=> \//{print $3}' | sort -u \
        | grep -Ev '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|libssl|libcrypto|libz)\.so' \
        | while read -r library; do cp -L "${library}" "${OUT}/native/lib/"; done
else
    echo "gpu-bundle: no native code in the bundle (above): the GPU machine builds it, or the bench goes without"
fi
echo "gpu-bundle: ${OUT} ($(du -sh "${OUT}" | cut -f1)): on the GPU machine, scripts/gpu-check.sh --bundle ${OUT}"
