#!/bin/sh
# Run by the Dockerfile's runtime stages as root: compiles the native port's transport
# (service/grpc/native/transport.cc, from the installed wheel) into $BERTSERVE_CACHE_DIR against the
# distribution's gRPC C++ library, then removes the compiler and headers and keeps the libraries the
# transport links. Debian and Ubuntu (apt).
set -eu
: "${BERTSERVE_CACHE_DIR:?set BERTSERVE_CACHE_DIR to where the image keeps the transport}"
load='from bertserve.service.grpc.native.transport import library; print(library()._name)'
apt-get update
apt-get install -y --no-install-recommends g++ pkg-config libgrpc++-dev
built="$(python -c "$load")"
# the packages holding the libraries it links (libc's own are essential and stay anyway)
keep="$(ldd "$built" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | xargs -r realpath \
    | xargs -r dpkg -S 2>/dev/null | cut -d: -f1 | sort -u || true)"
# shellcheck disable=SC2086  # one package name per word
[ -z "$keep" ] || apt-mark manual $keep >/dev/null
apt-get purge -y --auto-remove -o APT::AutoRemove::RecommendsImportant=false \
    -o APT::AutoRemove::SuggestsImportant=false g++ pkg-config libgrpc++-dev
apt-get clean
rm -rf /var/lib/apt/lists/*
chmod -R a+rX "$BERTSERVE_CACHE_DIR"
python -c "$load" >/dev/null  # still loads: every library it links is in the image
echo "native transport: $built"
