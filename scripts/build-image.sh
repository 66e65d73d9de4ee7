#!/usr/bin/env bash
# Builds the `cpu` image with Debian's podman (no Docker daemon) on a base made from Debian packages, then
# serves from the built image and answers one gRPC call on its main port and one on its native port. For
# machines where `podman run` cannot start a container (no cgroup delegation for crun): the image's filesystem is mounted (`podman image mount`) and
# `bertserve serve` runs in it by chroot, as the image's user, with the image's environment.
#
#   apt-get install -y podman mmdebstrap      # Debian bookworm; run as root
#   scripts/build-image.sh
#
# Environment:
#   TAG          the image tag (default bertserve:0.1.0-cpu)
#   WORK         scratch folder for the base tarball and the local torch index (default build/image)
#   TORCH_WHEEL  a torch CPU wheel file: served, with its dependencies from PyPI, as the exporter stage's
#                TORCH_INDEX_URL on 127.0.0.1 (for networks that reach PyPI but not download.pytorch.org)
#   PORT         the gRPC port the served image listens on for the check (default: a free one)
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${TAG:-bertserve:0.1.0-cpu}
WORK=${WORK:-build/image}
BASE=localhost/bertserve-base:bookworm
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
log() { printf '== %s\n' "$*" >&2; }

# 1. The base: Debian bookworm's python3 (3.11) from Debian packages, standing in for python:3.11-slim.
#    pip may install into the system Python there (PEP 668 marks Debian's as externally managed).
if ! podman image exists "$BASE"; then
    log "base image $BASE (mmdebstrap)"
    mmdebstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,passwd \
        bookworm "$WORK/base.tar"
    podman import --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' "$WORK/base.tar" "$BASE"
fi

# 2. The exporter stage installs torch alone from TORCH_INDEX_URL: optionally a local PEP 503 index.
build_args=(--build-arg "PYTHON_IMAGE=$BASE")
index_pid=
cleanup() {
    if [ -n "$index_pid" ]; then kill "$index_pid" 2>/dev/null || true; fi
    if [ -n "${server_pid:-}" ]; then kill "$server_pid" 2>/dev/null && wait "$server_pid" || true; fi
    if [ -n "${mounted:-}" ]; then podman image unmount "$TAG" >/dev/null || true; fi
}
trap cleanup EXIT
if [ -n "${TORCH_WHEEL:-}" ]; then
    log "local torch index from $TORCH_WHEEL"
    wheels="$WORK/torch-wheels"
    rm -rf "$wheels" "$WORK/index" && mkdir -p "$wheels"
    cp "$TORCH_WHEEL" "$wheels/"
    mapfile -t requires < <(python3 - "$TORCH_WHEEL" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    for line in wheel.read(name).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            print(line.split(":", 1)[1].split(";")[0].strip())
EOF
    )
    python3 -m pip download -q --only-binary :all: --python-version 3.11 --platform manylinux2014_x86_64 \
        --dest "$wheels" "${requires[@]}"
    python3 - "$wheels" "$WORK/index" <<'EOF'
import pathlib, re, shutil, sys
wheels, index = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for wheel in wheels.glob("*.whl"):
    project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    (index / project).mkdir(parents=True, exist_ok=True)
    shutil.copy2(wheel, index / project / wheel.name)
EOF
    index_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    python3 -m http.server --bind 127.0.0.1 --directory "$WORK/index" "$index_port" >/dev/null 2>&1 &
    index_pid=$!
    build_args+=(--build-arg "TORCH_INDEX_URL=http://127.0.0.1:$index_port/")
fi

# 3. The build: chroot isolation and the host's network (no CNI, no user namespaces needed).
log "podman build --target cpu -t $TAG"
start=$(date +%s)
podman build --isolation chroot --network host -v /etc/ssl/certs:/etc/ssl/certs:ro \
    "${build_args[@]}" --target cpu -t "$TAG" .
log "built $TAG in $(($(date +%s) - start)) s; size $(podman image inspect --format '{{.Size}}' "$TAG") bytes"

# 4. Serve from the image: its filesystem, its user, its environment, its ENTRYPOINT + CMD.
root=$(podman image mount "$TAG")
mounted=1
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=${PORT:-$(free_port)}
NATIVE_PORT=$(free_port)
mapfile -t image_env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$TAG" | sed '/^$/d')
# As Docker does for an image that sets no PATH.
printf '%s\n' "${image_env[@]}" | grep -q '^PATH=' ||
    image_env+=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
user=$(podman image inspect --format '{{.Config.User}}' "$TAG")
command=$(podman image inspect --format '{{join .Config.Entrypoint " "}} {{join .Config.Cmd " "}}' "$TAG")
# /proc and /dev from the host, in a mount namespace of the chroot's own (the image stays untouched).
# It execs (unshare, sh, chroot, env, the command: one process), so it is called in a subshell.
in_image() {
    exec unshare --mount sh -c '
        mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" && mount -t tmpfs tmpfs "$1/tmp" &&
        shift && exec "$@"' sh "$root" chroot --userspec="$user" "$root" \
        /usr/bin/env -i "${image_env[@]}" BERTSERVE_HOST=127.0.0.1 BERTSERVE_PORT="$PORT" \
        BERTSERVE_METRICS_PORT=0 BERTSERVE_HTTP_PORT=0 BERTSERVE_NATIVE_PORT="$NATIVE_PORT" "$@"
}
log "serving from the image on 127.0.0.1:$PORT: $command"
# shellcheck disable=SC2086  # the image's ENTRYPOINT + CMD, split into words as Docker does
(in_image $command) &
server_pid=$!
for _ in $(seq 300); do
    if (in_image python -c "
import grpc, sys
from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as hg
r = hg.HealthStub(grpc.insecure_channel('127.0.0.1:$PORT')).Check(h.HealthCheckRequest(), timeout=2)
sys.exit(0 if r.status == h.HealthCheckResponse.SERVING else 1)") 2>/dev/null; then
        break
    fi
    kill -0 "$server_pid" || { log "the server exited"; exit 1; }
    sleep 1
done
log "one call: bertserve embed (the image's client) against the image's server"
(in_image bertserve embed --address "127.0.0.1:$PORT" "the image answers") | head -c 300
echo
log "one call to the native port (its transport was built in the image)"
(in_image bertserve embed --address "127.0.0.1:$NATIVE_PORT" "the native port answers") | head -c 300
echo
kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=
[ "$status" -eq 0 ] || { log "the server exited with $status after SIGTERM"; exit 1; }
log "ok: the server answered, drained on SIGTERM and exited with 0"
