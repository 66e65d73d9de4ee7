#!/usr/bin/env bash
# Installs the Debian packages the tests use, when they are missing:
#   prometheus    promtool (rule and config checks) and a real Prometheus server (PromQL on a live scrape)
#   wordnet-base  WordNet 3.0, the training data of the default heads (tests/test_heads.py)
#   g++ pkg-config libgrpc++-dev  the bench's native load generator (bench/native/loadgen.cc, built on first use)
# Needs root (or passwordless sudo) and apt-get; otherwise prints the one command to run, and fails.
set -euo pipefail

need=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
[ -f /usr/share/wordnet/data.noun ] || need+=(wordnet-base)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v pkg-config >/dev/null 2>&1 && pkg-config --exists grpc++ || need+=(pkg-config libgrpc++-dev)
[ ${#need[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "make: the tests need ${need[*]} (Debian package names); install them with your system's package manager" >&2
    exit 1
fi
run=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        run=(sudo -n)
    else
        echo "make: the tests need Debian packages; run: sudo apt-get install -y --no-install-recommends ${need[*]}" >&2
        exit 1
    fi
fi
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
"${run[@]}" apt-get update -qq
"${run[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
