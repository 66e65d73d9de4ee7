#!/bin/sh
# Run by the Dockerfile's runtime stages as root: compiles the native port's transport
# (service/grpc/native/transport.cc, from the installed wheel) against the distribution's gRPC C++ library
# and the plain-text WordPiece (service/engine/native_wordpiece/wordpiece.cc) into $BERTSERVE_CACHE_DIR,
# then removes what it installed but the libraries they link.
# Debian and Ubuntu (apt). Nothing the image had before is removed.
set -eu
: "${BERTSERVE_CACHE_DIR:?set BERTSERVE_CACHE_DIR to where the image keeps the transport}"
load='from bertserve.service.grpc.native import transport
from bertserve.service.engine import native_wordpiece
print(transport.library()._name, native_wordpiece.library()._name)'
tools="g++ pkg-config libgrpc++-dev"
before="$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" {print $2}')"
apt-get update
# shellcheck disable=SC2086  # one package name per word
apt-get install -y --no-install-recommends $tools
built="$(python -c "$load")"
# kept: what was there before, and the packages holding the libraries it links (libc's are essential)
# shellcheck disable=SC2086  # the two libraries' paths
keep="$(ldd $built | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | xargs -r realpath \
    | xargs -r dpkg -S 2>/dev/null | cut -d: -f1 | sort -u || true)"
# shellcheck disable=SC2086
echo $before $keep | xargs -r apt-mark manual >/dev/null
remove=""
for tool in $tools; do
    echo "$before" | grep -qx "$tool" || remove="$remove $tool"
done
# shellcheck disable=SC2086
[ -z "$remove" ] || apt-get purge -y --auto-remove -o APT::AutoRemove::RecommendsImportant=false \
    -o APT::AutoRemove::SuggestsImportant=false $remove
apt-get clean
rm -rf /var/lib/apt/lists/*
chmod -R a+rX "$BERTSERVE_CACHE_DIR"
python -c "$load" >/dev/null  # still loads: every library it links is in the image
echo "native transport and WordPiece: $built"
