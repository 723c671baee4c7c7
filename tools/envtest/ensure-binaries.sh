#!/usr/bin/env bash
# Build (once) the control-plane binaries used by the integration-test harness
# (tests/harness): kube-apiserver, kube-controller-manager and etcd, and extract
# Knative Serving's CRDs. Everything goes into a per-user cache outside the
# checkout, keyed by version:
#
#   ${SESSIONMEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sessionmem}/envtest/k8s-<ver>-etcd-<ver>/
#     bin/{kube-apiserver,kube-controller-manager,etcd}
#     knative/{service,configuration,revision,route}.yaml  (+ .version)
#
# Idempotent: when everything is present it only prints that folder (stdout, one
# line). Progress goes to stderr. Each artefact is built under a temporary name
# and renamed into place, so an interrupted build is never taken for a finished
# one. Versions come from go.mod / etcd/go.mod next to this script and from
# KNATIVE_SERVING_VERSION below.
set -euo pipefail

KNATIVE_SERVING_VERSION="${KNATIVE_SERVING_VERSION:-v0.51.0}"
KNATIVE_CRDS=(service configuration revision route)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=envtest
# shellcheck source=../lib/common.sh
source "$here/../lib/common.sh"

K8S_VERSION="$(modver "$here/go.mod" k8s.io/kubernetes)"
ETCD_VERSION="$(modver "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)"

dest="$(cache_root)/envtest/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}"
bindir="$dest/bin"
kndir="$dest/knative"

complete() {
    local b f
    for b in kube-apiserver kube-controller-manager etcd; do
        [[ -x "$bindir/$b" ]] || return 1
    done
    [[ "$(cat "$kndir/.version" 2>/dev/null || true)" == "$KNATIVE_SERVING_VERSION" ]] || return 1
    for f in "${KNATIVE_CRDS[@]}"; do
        [[ -s "$kndir/$f.yaml" ]] || return 1
    done
    return 0
}

if complete; then
    printf '%s\n' "$dest"
    exit 0
fi

mkdir -p "$bindir"

# Serialise concurrent callers (parallel test sessions, CI next to a dev run).
lock_or_wait "$dest/.lock"
if complete; then
    printf '%s\n' "$dest"
    exit 0
fi
# We hold the lock: leftovers of an interrupted build are nobody's.
rm -rf "$dest"/.tmp.*

GO="$(find_go)"
go_build_env

tmpdir="$(mktemp -d "$dest/.tmp.XXXXXX")"
trap 'rm -rf "$tmpdir"' EXIT

# go build into a temporary name, then rename atomically into bin/.
build() {
    local moddir="$1" pkg="$2" name="$3" ldflags="$4" start
    if [[ -x "$bindir/$name" ]]; then
        log "$name already built"
        return 0
    fi
    log "building $name ($pkg) ... (first time: several minutes)"
    start=$SECONDS
    (cd "$moddir" && "$GO" build -trimpath -ldflags "-s -w $ldflags" -o "$tmpdir/$name" "$pkg") \
        || die "go build $pkg failed"
    mv -f "$tmpdir/$name" "$bindir/$name"
    log "built $name in $((SECONDS - start))s"
}

log "$("$GO" version); cache: $dest"

k8s_minor="${K8S_VERSION#v1.}"
k8s_minor="${k8s_minor%%.*}"
k8s_ldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$k8s_minor"
    k8s_ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

build "$here/etcd" go.etcd.io/etcd/server/v3 etcd ""
build "$here" k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver "$k8s_ldflags"
build "$here" k8s.io/kubernetes/cmd/kube-controller-manager kube-controller-manager "$k8s_ldflags"

if [[ "$(cat "$kndir/.version" 2>/dev/null || true)" != "$KNATIVE_SERVING_VERSION" ]]; then
    log "fetching knative.dev/serving@$KNATIVE_SERVING_VERSION CRDs"
    json="$(cd "$tmpdir" && GOFLAGS=-mod=mod "$GO" mod download -json "knative.dev/serving@$KNATIVE_SERVING_VERSION")" \
        || die "go mod download knative.dev/serving@$KNATIVE_SERVING_VERSION failed"
    srcdir="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir":[[:space:]]*"\(.*\)",\{0,1\}$/\1/p' | head -n1)"
    [[ -n "$srcdir" && -d "$srcdir/config/core/300-resources" ]] \
        || die "no config/core/300-resources in knative.dev/serving module dir '$srcdir'"
    mkdir -p "$tmpdir/knative"
    for f in "${KNATIVE_CRDS[@]}"; do
        cp "$srcdir/config/core/300-resources/$f.yaml" "$tmpdir/knative/$f.yaml"
    done
    printf '%s\n' "$KNATIVE_SERVING_VERSION" >"$tmpdir/knative/.version"
    chmod -R u+w "$tmpdir/knative"
    rm -rf "$kndir.old"
    if [[ -e "$kndir" ]]; then mv "$kndir" "$kndir.old"; fi
    mv "$tmpdir/knative" "$kndir"
    rm -rf "$kndir.old"
    log "knative CRDs in $kndir"
fi

complete || die "build finished but $dest is incomplete"
log "done"
printf '%s\n' "$dest"
