#!/usr/bin/env bash
# `make gpu-check`: on a machine with an NVIDIA GPU, from a fresh clone, install what the GPU bench needs,
# export the default model and run `bertserve bench --provider cuda --quick` once per workers setting
# (native-N: workers N, the gRPC Embed calls to the native port of every front, service/grpc/native/;
# a run may add settings of its own: native-auto:max_batch_size=256), then once on the CPU cores
# (single-input against 32-input calls), writing docs/performance/gpu-<device>/: gpu-check.md and
# gpu-check.json (the goals of issue 26, one column per run) and workers-<run>/, cpu/ (each run's bench.json,
# bench.md and plots; its logs stay in build/gpu-check/).
#
# Phases, each under its own time budget (seconds), a ceiling against a hang: on the H200 with --bundle, two
# GPU runs took about 65 s each, setup and sanity under 30 s together:
#   gpu      nvidia-smi answers and lists a GPU, before anything is installed
#   setup    `make setup` into .venv-gpu (torch's CPU build is enough: it only exports), then
#            onnxruntime-gpu in place of onnxruntime; the native load generator, if it can be built.
#            With --bundle DIR (no package index): DIR/wheels into build/gpu-check/site instead
#   sanity   ONNX Runtime is a GPU build and a session really gets CUDAExecutionProvider
#   export   the default model (all-minilm-l6-v2 with its fp16 graph), unless the repository has it
#   bench    one run per workers setting (server-fp32, its HTTP twin, server-fp16)
#   cpu      server-fp32 on the CPU provider, every core (workers auto, native transport, one-thread
#            instances on half the cores): single-input callers against 32-input requests
#   report   the goals side by side (python -m bertserve.bench.gpu_check summary)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="${ROOT}/scripts/gpu-check.sh"
MODEL=all-minilm-l6-v2
TARGETS=server-fp32,server-fp32-http,server-fp16
NO_GPU=3      # the same code as python -m bertserve.bench.gpu_check sanity
OVER_BUDGET=4
: "${GPU_CHECK_GPU_S:=15}" "${GPU_CHECK_SETUP_S:=140}" "${GPU_CHECK_SANITY_S:=20}"
: "${GPU_CHECK_EXPORT_S:=90}" "${GPU_CHECK_BENCH_S:=95}" "${GPU_CHECK_CPU_S:=120}" "${GPU_CHECK_REPORT_S:=15}"

usage() {
    cat <<'EOF'
usage: scripts/gpu-check.sh [--workers LIST] [--out DIR] [--repo DIR] [--python PY] [--no-install]
                            [--bundle DIR] [--setting NAME=VALUE ...]

  --workers LIST  runs to bench, comma-separated, each a workers setting (an integer >= 1, auto, or
                  native-N: workers N, the gRPC Embed calls to the native port of every front; N an
                  integer or auto, native is native-1) and :NAME=VALUE settings of that run alone
                  (loadgen_threads=N: the bench's gRPC client's threads, default 4; default runs
                  native-auto,native-auto:loadgen_threads=1,native-auto:engines=2;
                  environment GPU_CHECK_WORKERS)
  --out DIR       where the results go (default docs/performance/gpu-<device>, after the GPU's model)
  --repo DIR      model repository; the default model is exported into it unless it is there
                  (default model_repository; environment REPO)
  --python PY     run in this interpreter's environment (bertserve installed in it with the export and
                  dev extras) instead of making .venv-gpu
  --no-install    install and build nothing; stop with one line where something is missing
  --bundle DIR    a machine without a package index: install from DIR/wheels (`make gpu-bundle` made it
                  elsewhere) into build/gpu-check/site, for PY's Python (default python3, whose own
                  packages stay visible: NVIDIA's CUDA libraries), take the model from
                  DIR/model_repository unless --repo says otherwise, and the native code from DIR/native
  --setting NAME=VALUE  a server setting for every run, over the GPU overlay's (repeatable; e.g.
                  max_batch_size=256 with max_batch_tokens=65536)

Budgets per phase, in seconds (environment; ceilings: a phase past its budget stops the check):
  GPU_CHECK_GPU_S 15, GPU_CHECK_SETUP_S 140, GPU_CHECK_SANITY_S 20, GPU_CHECK_EXPORT_S 90,
  GPU_CHECK_BENCH_S 95 (each run), GPU_CHECK_CPU_S 120 (0: no CPU run), GPU_CHECK_REPORT_S 15

Exit status: 0 done, 1 a phase failed, 2 a wrong command line, 3 no usable GPU, 4 a phase went past
its budget.
EOF
}

fail() {  # fail CODE MESSAGE: one line on stderr, then exit CODE
    echo "gpu-check: $2" >&2
    exit "$1"
}

# ---- the phases (each runs as `gpu-check.sh __phase NAME` under `timeout`, with the state exported) ----

phase_gpu() {
    command -v nvidia-smi >/dev/null 2>&1 || fail "$NO_GPU" "no usable GPU: nvidia-smi is not on PATH (no NVIDIA driver)"
    local answer
    if ! answer="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1)"; then
        fail "$NO_GPU" "no usable GPU: nvidia-smi failed: $(printf '%s\n' "${answer}" | grep -v '^\s*$' | tail -n 1)"
    fi
    [ -n "$(printf '%s' "${answer}" | tr -d '[:space:]')" ] || fail "$NO_GPU" "no usable GPU: nvidia-smi lists no GPU"
    echo "gpu-check: GPU $(printf '%s\n' "${answer}" | head -n 1)"
}

phase_setup() {
    if [ -n "${BUNDLE}" ]; then  # every wheel of the bundle, no index: pip resolved them for this Python
        "${PYTHON_BIN}" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
            || fail 1 "--bundle needs Python 3.11 or newer (PYTHONSAFEPATH keeps the checkout off the path)"
        compgen -G "${BUNDLE}/wheels/*.whl" >/dev/null || fail 1 "no wheels in ${BUNDLE}/wheels (make gpu-bundle)"
        rm -rf "${SCRATCH}/site"
        "${PYTHON_BIN}" -m pip install -q --no-index --no-deps --no-compile --target "${SCRATCH}/site" \
            "${BUNDLE}"/wheels/*.whl || fail 1 "pip install from ${BUNDLE}/wheels failed"
    elif [ "${GPU_CHECK_OWN_VENV}" = 1 ] && [ "${GPU_CHECK_INSTALL}" = 1 ]; then
        make -C "${ROOT}" setup VENV=.venv-gpu || fail 1 "make setup VENV=.venv-gpu failed"
    fi
    [ -x "${PYTHON_BIN}" ] || fail 1 "no interpreter ${PYTHON_BIN} (without --no-install, the setup phase makes .venv-gpu)"
    "${PYTHON_BIN}" -c 'import bertserve.bench.gpu_check' 2>/dev/null \
        || fail 1 "${PYTHON_BIN} cannot import bertserve.bench: pip install -e '.[export,dev]' into its environment"
    if ! "${PYTHON_BIN}" -c 'import onnxruntime as o, sys; sys.exit(o.get_device() != "GPU")' 2>/dev/null \
        && [ "${GPU_CHECK_INSTALL}" = 1 ] && [ -z "${BUNDLE}" ]; then
        # both ship the module onnxruntime, so both go and the GPU build comes back alone (a `make setup`
        # after a change of pyproject.toml brings onnxruntime back); the extras bring CUDA's and cuDNN's wheels
        "${PYTHON_BIN}" -m pip uninstall -q -y onnxruntime onnxruntime-gpu || fail 1 "pip uninstall onnxruntime failed"
        "${PYTHON_BIN}" -m pip install -q "onnxruntime-gpu[cuda,cudnn]>=1.20" || fail 1 "pip install onnxruntime-gpu failed"
    fi
    if [ "${GPU_CHECK_INSTALL}" = 1 ]; then  # built once, here rather than inside the first run's budget
        "${PYTHON_BIN}" -c 'from bertserve.bench.native_loadgen import find_binary; find_binary()' >/dev/null 2>&1 \
            || echo "gpu-check: no native load generator (g++, libgrpc++-dev): the bench sends with Python"
        "${PYTHON_BIN}" -c 'from bertserve.service.grpc.native.transport import library; library()' >/dev/null 2>&1 \
            || echo "gpu-check: the native port cannot be built here (g++, libgrpc++-dev)"
    fi
}

phase_sanity() {  # leaves the library path and the GPU's folder name in SCRATCH for the later phases
    local libraries
    libraries="$("${PYTHON_BIN}" -m bertserve.bench.gpu_check library-path)" || fail 1 "cannot list NVIDIA's library folders"
    # onnxruntime-gpu loads CUDA's libraries by name: those of NVIDIA's pip packages go on the search path
    LD_LIBRARY_PATH="$(join_paths "${libraries}" "${LD_LIBRARY_PATH:-}")"
    export LD_LIBRARY_PATH
    "${PYTHON_BIN}" -m bertserve.bench.gpu_check sanity || exit $?
    printf '%s\n' "${LD_LIBRARY_PATH}" >"${SCRATCH}/library-path"
    "${PYTHON_BIN}" -m bertserve.bench.gpu_check device-dir >"${SCRATCH}/device-dir" || fail 1 "cannot name the GPU's folder"
}

join_paths() {  # join_paths A B: A:B without an empty entry (one would mean the current directory)
    local joined
    joined="$(printf '%s:%s' "$1" "$2" | tr -s ':')"
    joined="${joined#:}"
    printf '%s' "${joined%:}"
}

phase_export() {
    if compgen -G "${REPO}/${MODEL}/*/manifest.json" >/dev/null; then
        echo "gpu-check: ${REPO}/${MODEL} is there"
        return 0
    fi
    "${PYTHON_BIN}" -m bertserve.cli export --default --out "${REPO}" || fail 1 "bertserve export --default failed"
}

phase_bench() {  # phase_bench RUN: WORKERS[:NAME=VALUE...]
    local spec="$1" workers="${1%%:*}" name="${1//[:=\/]/-}" run
    run="${SCRATCH}/workers-${name}"
    local args=(--provider cuda --quick --connections per-caller --model-repo "${REPO}" --model "${MODEL}" --targets "${TARGETS}" --out "${run}")
    local setting own=()
    [[ "${spec}" == *:* ]] && IFS=: read -r -a own <<<"${spec#*:}"
    for setting in ${GPU_CHECK_SETTINGS} ${own[@]+"${own[@]}"}; do
        case "${setting}" in  # the bench's client, not the server
            loadgen_threads=*) args+=(--loadgen-threads "${setting#*=}") ;;
            *) args+=(--server-setting "${setting}") ;;
        esac
    done
    if [[ "${workers}" == native* ]]; then
        if ! "${PYTHON_BIN}" -c 'from bertserve.service.grpc.native.transport import library; library()' >/dev/null 2>&1; then
            echo "gpu-check: no native port here (this bertserve lacks it, or g++ and libgrpc++-dev): workers ${workers} not measured"
            return 0
        fi
        local fronts="${workers#native}"
        fronts="${fronts#-}"
        args+=(--front native --server-setting "workers=${fronts:-1}")
    elif "${PYTHON_BIN}" -m bertserve.cli bench --help 2>/dev/null | grep -q -- '--workers'; then
        args+=(--workers "${workers}")
    elif "${PYTHON_BIN}" -c 'import sys; from bertserve.service.settings import Settings; sys.exit("workers" not in Settings.model_fields)'; then
        args+=(--server-setting "workers=${workers}")
    elif [ "${workers}" != 1 ]; then
        echo "gpu-check: this bertserve has no workers setting: workers ${workers} not measured"
        return 0
    fi
    rm -rf "${run}"
    "${PYTHON_BIN}" -m bertserve.cli bench "${args[@]}" || fail 1 "bertserve bench (${spec}) failed: see ${run}/logs"
    save_run "${run}" "workers-${name}"
}

save_run() {  # save_run RUN_DIR NAME: its results into OUT/NAME
    mkdir -p "${OUT}/$2"
    cp "$1/bench.json" "$1/bench.md" "$1"/*.png "${OUT}/$2/" || fail 1 "cannot copy the results of $2 from $1"
}

phase_cpu() {  # issue 26's many-core goal: single-input callers against 32-input requests, CPU provider
    local run="${SCRATCH}/cpu" cpus
    cpus="$("${PYTHON_BIN}" -c 'from bertserve.service.settings import usable_cpus; print(usable_cpus())')" \
        || fail 1 "cannot count the CPUs"
    local args=(--provider cpu --quick --connections per-caller --model-repo "${REPO}" --model "${MODEL}"
        --targets server-fp32 --threads 1 --out "${run}" --server-setting workers=auto
        --server-setting grpc_transport=native --server-setting "instances=$(((cpus + 1) / 2))")
    rm -rf "${run}" "${OUT:?}/cpu"
    "${PYTHON_BIN}" -m bertserve.cli bench "${args[@]}" || fail 1 "bertserve bench (cpu) failed: see ${run}/logs"
    save_run "${run}" cpu
}

phase_report() {
    "${PYTHON_BIN}" -m bertserve.bench.gpu_check summary "${OUT}"
}

run_phase() {  # run_phase NAME BUDGET [ARG]: the phase under `timeout`, stopped with one line past it
    local name="$1" budget="$2" started="${SECONDS}" code
    shift 2
    [ "${name}" = gpu ] || echo "gpu-check: [${name}] budget ${budget} s"
    timeout --kill-after=5 "${budget}" "${SELF}" __phase "${name}" "$@"
    code=$?
    if [ "${code}" -eq 124 ] || [ "${code}" -eq 137 ]; then
        case "${name}" in
            gpu | sanity) fail "$NO_GPU" "no usable GPU: the ${name} check did not answer within ${budget} s" ;;
            *) fail "$OVER_BUDGET" "phase ${name} went past its budget of ${budget} s" ;;
        esac
    fi
    [ "${code}" -eq 0 ] || exit "${code}"  # the phase said why
    [ "${name}" = gpu ] || echo "gpu-check: [${name}] done in $((SECONDS - started)) s"
}

if [ "${1:-}" = __phase ]; then
    shift
    "phase_$1" "${@:2}"
    exit $?
fi

# ---- the command line ----
WORKERS="${GPU_CHECK_WORKERS:-native-auto,native-auto:loadgen_threads=1,native-auto:engines=2}"
OUT=""
REPO_GIVEN=""  # --repo: with --bundle, the bundle's model otherwise (the environment's REPO aside)
REPO="${REPO:-model_repository}"
PYTHON_BIN=""
INSTALL=1
BUNDLE=""
SETTINGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --workers | --out | --repo | --python | --bundle | --setting)
            [ $# -ge 2 ] || fail 2 "$1 needs a value (see --help)"
            case "$1" in
                --workers) WORKERS="$2" ;;
                --out) OUT="$2" ;;
                --repo) REPO="$2"; REPO_GIVEN=1 ;;
                --python) PYTHON_BIN="$2" ;;
                --setting)
                    [[ "$2" =~ ^[a-z_]+=[^[:space:]]+$ ]] || fail 2 "--setting $2: give NAME=VALUE (a setting's name, no spaces)"
                    SETTINGS+=("$2") ;;
                --bundle) BUNDLE="$(CDPATH='' cd -- "$2" 2>/dev/null && pwd)" || fail 2 "--bundle $2: no such folder" ;;
            esac
            shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        *) fail 2 "unknown argument $1 (see --help)" ;;
    esac
done
IFS=, read -r -a WORKERS_LIST <<<"${WORKERS}"
[ "${#WORKERS_LIST[@]}" -gt 0 ] || fail 2 "--workers: give at least one setting"
for workers in "${WORKERS_LIST[@]}"; do
    [[ "${workers%%:*}" =~ ^(auto|[1-9][0-9]*|native(-auto|-[1-9][0-9]*)?)$ ]] \
        || fail 2 "--workers: ${workers%%:*} is neither an integer >= 1, auto, nor native-N (N an integer or auto)"
    [[ "${workers}" =~ ^[^:]*(:[a-z_]+=[^:[:space:]]+)*$ ]] \
        || fail 2 "--workers: ${workers}: give a run's own settings as :NAME=VALUE"
done

cd "${ROOT}" || exit 1
run_phase gpu "${GPU_CHECK_GPU_S}"

GPU_CHECK_OWN_VENV=0
SCRATCH="${ROOT}/build/gpu-check"
mkdir -p "${SCRATCH}"
if [ -n "${BUNDLE}" ]; then
    PYTHON_BIN="${PYTHON_BIN:-$(command -v python3)}"
    [ -n "${REPO_GIVEN}" ] || REPO="${BUNDLE}/model_repository"
    # the bundle's packages first; the checkout's bertserve/ (not the package) never on the path
    export PYTHONPATH="${SCRATCH}/site" PYTHONSAFEPATH=1
    if [ -d "${BUNDLE}/native" ]; then  # the native code built with the bundle, and its libraries
        export BERTSERVE_CACHE_DIR="${BUNDLE}/native" LD_LIBRARY_PATH="${BUNDLE}/native/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
    fi
elif [ -z "${PYTHON_BIN}" ]; then
    PYTHON_BIN="${ROOT}/.venv-gpu/bin/python"
    GPU_CHECK_OWN_VENV=1
fi
export PYTHON_BIN REPO SCRATCH BUNDLE GPU_CHECK_OWN_VENV GPU_CHECK_INSTALL="${INSTALL}" GPU_CHECK_SETTINGS="${SETTINGS[*]}"
total=$((GPU_CHECK_SETUP_S + GPU_CHECK_SANITY_S + GPU_CHECK_EXPORT_S + ${#WORKERS_LIST[@]} * GPU_CHECK_BENCH_S + GPU_CHECK_CPU_S + GPU_CHECK_REPORT_S))
echo "gpu-check: workers ${WORKERS}; at most ${total} s from here"

run_phase setup "${GPU_CHECK_SETUP_S}"
run_phase sanity "${GPU_CHECK_SANITY_S}"
LD_LIBRARY_PATH="$(cat "${SCRATCH}/library-path")"
export LD_LIBRARY_PATH
OUT="${OUT:-docs/performance/$(cat "${SCRATCH}/device-dir")}"
mkdir -p "${OUT}" || fail 1 "cannot make ${OUT}"
export OUT
run_phase export "${GPU_CHECK_EXPORT_S}"
for workers in "${WORKERS_LIST[@]}"; do
    run_phase bench "${GPU_CHECK_BENCH_S}" "${workers}"
done
run_phase report "${GPU_CHECK_REPORT_S}"  # the GPU runs' report stands if the CPU run fails
if [ "${GPU_CHECK_CPU_S}" -gt 0 ]; then
    run_phase cpu "${GPU_CHECK_CPU_S}"
    run_phase report "${GPU_CHECK_REPORT_S}"
fi
echo "gpu-check: done: ${OUT}/gpu-check.md"
