#!/usr/bin/env bash
# Builds (once) Knative Serving for the e2e cluster, and the e2e's own Knative tools, from knative/go.mod:
#
#   $cache/e2e/knative-<ver>/bin/{controller,activator,autoscaler,webhook,queue}   knative.dev/serving <ver>
#   $cache/e2e/knative-tools-<hash>/bin/{kingress,manifests}                      knative/kingress, knative/manifests
#
# ($cache is ${SESSIONMEM_CACHE_DIR:-~/.cache/sessionmem}.) Whatever is missing is built in ONE `go build`
# (one module graph, one build cache: the five commands share most of their packages), with
# `-trimpath -ldflags=-s -w`. knative/go.mod requires knative.dev/serving and nothing at a higher version
# than serving's own go.mod, so the commands are built from exactly the released dependency versions.
# The release manifests are in the module zip (config/core): KNATIVE_SERVING_DIR and the networking and
# caching module directories are printed for tools/e2e/cluster.sh, which renders them with `manifests`.
#
# Idempotent: when everything is present it only prints, on stdout, NAME=path lines (KNATIVE_BIN_DIR,
# KINGRESS, KNATIVE_MANIFESTS, KNATIVE_SERVING_DIR, KNATIVE_NETWORKING_DIR, KNATIVE_CACHING_DIR,
# KNATIVE_VERSION). Built under a temporary name and renamed into place; `nice -n 10` (E2E_NICE).
set -euo pipefail
LOG_TAG=e2e-knative
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/common.sh
source "$here/../lib/common.sh"

mod="$here/knative"
SERVING_MODULE=knative.dev/serving
SERVING_VERSION="$(modver "$mod/go.mod" "$SERVING_MODULE")"
# Knative's own release name for this module version (v0.47.0 is Knative v1.20.0).
KNATIVE_RELEASE="v1.$((10#$(printf '%s' "${SERVING_VERSION#v0.}" | cut -d. -f1) - 27)).$(printf '%s' "$SERVING_VERSION" | cut -d. -f3)"
COMMANDS=(controller activator autoscaler webhook queue)
TOOLS=(kingress manifests)
TOOLS_KEY="$(cd "$mod" && cat go.mod go.sum kingress/*.go manifests/*.go | sha256sum | cut -c1-12)"

e2e_cache="$(cache_root)/e2e"
knative_bin="$e2e_cache/knative-$SERVING_VERSION/bin"
tools_bin="$e2e_cache/knative-tools-$TOOLS_KEY/bin"

missing() {
    local c
    for c in "${COMMANDS[@]}"; do [[ -x "$knative_bin/$c" ]] || printf '%s\n' "$SERVING_MODULE/cmd/$c"; done
    for c in "${TOOLS[@]}"; do [[ -x "$tools_bin/$c" ]] || printf '%s\n' "./$c"; done
}

GO="$(find_go)"
module_dir() { (cd "$mod" && GOWORK=off "$GO" list -m -f '{{.Dir}}' "$1"); }

report() {
    printf 'KNATIVE_VERSION=%s\nKNATIVE_BIN_DIR=%s\nKINGRESS=%s\nKNATIVE_MANIFESTS=%s\n' \
        "$KNATIVE_RELEASE" "$knative_bin" "$tools_bin/kingress" "$tools_bin/manifests"
    # The module zips are in the Go module cache once the build has run (`go list` downloads them if not).
    printf 'KNATIVE_SERVING_DIR=%s\nKNATIVE_NETWORKING_DIR=%s\nKNATIVE_CACHING_DIR=%s\n' \
        "$(module_dir "$SERVING_MODULE")" "$(module_dir knative.dev/networking)" "$(module_dir knative.dev/caching)"
}

if [[ -z "$(missing)" ]]; then report; exit 0; fi

mkdir -p "$knative_bin" "$tools_bin"
lock_or_wait "$e2e_cache/.knative.lock"
if [[ -z "$(missing)" ]]; then report; exit 0; fi
rm -rf "$e2e_cache"/.tmp.knative.*
go_build_env
tmpdir="$(mktemp -d "$e2e_cache/.tmp.knative.XXXXXX")"
trap 'rm -rf "$tmpdir"' EXIT

mapfile -t packages < <(missing)
log "$("$GO" version); building ${packages[*]} ($SERVING_MODULE $SERVING_VERSION = Knative $KNATIVE_RELEASE) ..."
start=$SECONDS
(cd "$mod" && nice -n "${E2E_NICE:-10}" "$GO" build -trimpath -ldflags "-s -w" -o "$tmpdir/" "${packages[@]}") \
    || die "go build of Knative failed"
for c in "${COMMANDS[@]}"; do [[ -x "$tmpdir/$c" ]] && mv -f "$tmpdir/$c" "$knative_bin/$c"; done
for c in "${TOOLS[@]}"; do [[ -x "$tmpdir/$c" ]] && mv -f "$tmpdir/$c" "$tools_bin/$c"; done
[[ -z "$(missing)" ]] || die "build finished but a binary is missing: $(missing | tr '\n' ' ')"
log "built in $((SECONDS - start))s"
# Earlier builds of our tools are of no further use.
find "$e2e_cache" -maxdepth 1 -name 'knative-tools-*' ! -name "knative-tools-$TOOLS_KEY" -exec rm -rf {} +
report
