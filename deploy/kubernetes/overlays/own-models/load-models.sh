#!/bin/sh
# The own-models overlay's init container: adds to the model repository BERTSERVE_MODEL_REPO (the claim)
# the model versions that BERTSERVE_MODELS_SOURCE holds and it lacks, then exits; the server starts after.
# A source already loaded (recorded in REPO/.loaded-from) is not fetched again. Sources (models-source.env):
#   checkpoint:DIR   `bertserve export --checkpoint DIR --name $BERTSERVE_MODELS_NAME $BERTSERVE_EXPORT_ARGS`
#   repository:DIR   a model repository, copied
#   http(s)://...    a tar archive of a model repository, unpacked (members outside it are refused)
set -eu

repo=${BERTSERVE_MODEL_REPO:-/models}
source=${BERTSERVE_MODELS_SOURCE:?"load-models: set BERTSERVE_MODELS_SOURCE (models-source.env)"}
record="$repo/.loaded-from"
if [ -f "$record" ] && [ "$(cat "$record")" = "$source" ]; then
    echo "load-models: $repo already holds $source"
    exit 0
fi

# Each pod stages on the claim in a folder of its own, and every complete version is renamed into place:
# the server never sees half a model, and pods that start together do not write into each other's.
staging="$repo/.staging-${HOSTNAME:-$$}"
rm -rf "$staging"
mkdir -p "$staging/repo" "$staging/tmp"
export TMPDIR="$staging/tmp"  # the export's scratch files, on the claim rather than in memory

case "$source" in
checkpoint:*)
    # shellcheck disable=SC2086  # BERTSERVE_EXPORT_ARGS is a list of flags
    bertserve export --checkpoint "${source#checkpoint:}" --out "$staging/repo" \
        --name "${BERTSERVE_MODELS_NAME:?"load-models: set BERTSERVE_MODELS_NAME for a checkpoint: source"}" \
        ${BERTSERVE_EXPORT_ARGS:-}
    ;;
repository:*)
    cp -R "${source#repository:}/." "$staging/repo/"
    ;;
http://* | https://*)
    python - "$source" "$staging/repo" <<'EOF'
import sys, tarfile, urllib.request

url, out = sys.argv[1:]
with urllib.request.urlopen(url, timeout=60) as response, tarfile.open(fileobj=response, mode="r|*") as archive:
    archive.extractall(out, filter="data")  # refuses absolute paths, .. and links out of the folder
EOF
    ;;
*)
    echo "load-models: BERTSERVE_MODELS_SOURCE=$source: expected checkpoint:DIR, repository:DIR or an http(s) URL" >&2
    exit 2
    ;;
esac

loaded=0
for version in "$staging"/repo/*/*/; do
    [ -f "$version/manifest.json" ] || continue
    name=$(basename "$(dirname "$version")")
    mkdir -p "$repo/$name"
    if mv -T "$version" "$repo/$name/$(basename "$version")" 2>/dev/null; then
        loaded=$((loaded + 1))
        echo "load-models: added $name/$(basename "$version")"
    else
        echo "load-models: $name/$(basename "$version") is already in $repo; kept"
    fi
done
rm -rf "$staging"
if [ "$loaded" -eq 0 ] && ! ls "$repo"/*/*/manifest.json >/dev/null 2>&1; then
    echo "load-models: $source holds no model version (NAME/VERSION/manifest.json)" >&2
    exit 1
fi
printf '%s' "$source" >"$record"
