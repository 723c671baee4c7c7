#!/usr/bin/env bash
# Builds (once) the node binaries of the e2e cluster from their Go modules:
#
#   $cache/e2e/k8s-<ver>/bin/{kubelet,kube-scheduler,kube-proxy,kubectl}  node/go.mod
#   $cache/e2e/coredns-<ver>-<hash>/bin/coredns                     coredns/
#   $cache/e2e/pause-<hash>/bin/pause                               pause/
#   $cache/e2e/kube-router-<ver>/bin/kube-router                    its own module, at KUBE_ROUTER_VERSION
#
# ($cache is ${SESSIONMEM_CACHE_DIR:-~/.cache/sessionmem}.) The control plane
# (kube-apiserver, kube-controller-manager, etcd) is tools/envtest's, not built
# here; node/go.mod pins the same k8s.io/kubernetes version, which is checked.
#
# Idempotent: when everything is present it only prints, on stdout, one
# NAME=path line per binary (KUBELET, KUBE_SCHEDULER, KUBE_PROXY, KUBECTL,
# COREDNS, PAUSE, KUBE_ROUTER). Each binary is built under a temporary name and renamed into place.
# Builds run under `nice -n 10` (E2E_NICE to change): the machine is shared.
#
# `build-binaries.sh kubectl` builds (once) and prints only KUBECTL=path: the integration tests drive the
# kubectl plugin's own port-forward with it against tools/envtest's API server (same version).
set -euo pipefail
LOG_TAG=e2e-binaries
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/common.sh
source "$here/../lib/common.sh"

K8S_VERSION="$(modver "$here/node/go.mod" k8s.io/kubernetes)"
ENVTEST_K8S_VERSION="$(modver "$here/../envtest/go.mod" k8s.io/kubernetes)"
[[ "$K8S_VERSION" == "$ENVTEST_K8S_VERSION" ]] \
    || die "tools/e2e/node/go.mod pins k8s.io/kubernetes $K8S_VERSION, tools/envtest/go.mod $ENVTEST_K8S_VERSION: keep them equal"
COREDNS_VERSION="$(modver "$here/coredns/go.mod" github.com/coredns/coredns)"
# The CoreDNS plugin set and the pause source are ours: their hash is part of the key.
COREDNS_KEY="$COREDNS_VERSION-$(cat "$here/coredns/go.sum" "$here/coredns/main.go" | sha256sum | cut -c1-8)"
PAUSE_KEY="$(cat "$here/pause/go.mod" "$here/pause/main.go" | sha256sum | cut -c1-12)"
# kube-router, the NetworkPolicy enforcer (cluster.sh runs only its firewall controller), is built with
# `go install module@version`: its own go.mod and go.sum, exactly as released, checked against the
# checksum database.
KUBE_ROUTER_MODULE=github.com/cloudnativelabs/kube-router/v2
KUBE_ROUTER_VERSION="${E2E_KUBE_ROUTER_VERSION:-v2.1.0}"

e2e_cache="$(cache_root)/e2e"
k8s_bin="$e2e_cache/k8s-$K8S_VERSION/bin"
coredns_bin="$e2e_cache/coredns-$COREDNS_KEY/bin"
pause_bin="$e2e_cache/pause-$PAUSE_KEY/bin"
kube_router_bin="$e2e_cache/kube-router-$KUBE_ROUTER_VERSION/bin"

declare -A BINARIES=(
    [KUBELET]="$k8s_bin/kubelet"
    [KUBE_SCHEDULER]="$k8s_bin/kube-scheduler"
    [KUBE_PROXY]="$k8s_bin/kube-proxy"
    [KUBECTL]="$k8s_bin/kubectl"
    [COREDNS]="$coredns_bin/coredns"
    [PAUSE]="$pause_bin/pause"
    [KUBE_ROUTER]="$kube_router_bin/kube-router"
)

WANTED=(KUBELET KUBE_SCHEDULER KUBE_PROXY KUBECTL COREDNS PAUSE KUBE_ROUTER)
case "${1:-}" in
    "") ;;
    kubectl) WANTED=(KUBECTL) ;;
    *) die "usage: build-binaries.sh [kubectl]" ;;
esac

complete() {
    local name
    for name in "${WANTED[@]}"; do [[ -x "${BINARIES[$name]}" ]] || return 1; done
}

report() {
    local name
    for name in "${WANTED[@]}"; do
        printf '%s=%s\n' "$name" "${BINARIES[$name]}"
    done
}

if complete; then report; exit 0; fi

mkdir -p "$e2e_cache" "$k8s_bin" "$coredns_bin" "$pause_bin" "$kube_router_bin"
lock_or_wait "$e2e_cache/.binaries.lock"
if complete; then report; exit 0; fi
rm -rf "$e2e_cache"/.tmp.*

GO="$(find_go)"
go_build_env
tmpdir="$(mktemp -d "$e2e_cache/.tmp.XXXXXX")"
trap 'rm -rf "$tmpdir"' EXIT

# go build into a temporary name, then rename atomically into place.
build() {
    local moddir="$1" pkg="$2" out="$3" ldflags="$4" start name
    name="$(basename "$out")"
    if [[ -x "$out" ]]; then return 0; fi
    log "building $name ($pkg) ..."
    start=$SECONDS
    (cd "$moddir" && nice -n "${E2E_NICE:-10}" "$GO" build -trimpath -ldflags "-s -w $ldflags" \
        -o "$tmpdir/$name" "$pkg") || die "go build $pkg failed"
    mv -f "$tmpdir/$name" "$out"
    log "built $name in $((SECONDS - start))s"
}

log "$("$GO" version); cache: $e2e_cache"

# Same version stamping as tools/envtest: the API server and kubelet compare
# versions (version skew checks), so the node must not report v0.0.0.
k8s_minor="${K8S_VERSION#v1.}"
k8s_minor="${k8s_minor%%.*}"
k8s_ldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$k8s_minor"
    k8s_ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

if [[ "${WANTED[*]}" == KUBECTL ]]; then
    build "$here/node" k8s.io/kubernetes/cmd/kubectl "$k8s_bin/kubectl" "$k8s_ldflags"
    complete || die "build finished but kubectl is missing"
    report
    exit 0
fi

build "$here/pause" . "$pause_bin/pause" ""
build "$here/node" k8s.io/kubernetes/cmd/kube-scheduler "$k8s_bin/kube-scheduler" "$k8s_ldflags"
build "$here/node" k8s.io/kubernetes/cmd/kube-proxy "$k8s_bin/kube-proxy" "$k8s_ldflags"
build "$here/node" k8s.io/kubernetes/cmd/kubelet "$k8s_bin/kubelet" "$k8s_ldflags"
build "$here/node" k8s.io/kubernetes/cmd/kubectl "$k8s_bin/kubectl" "$k8s_ldflags"
build "$here/coredns" . "$coredns_bin/coredns" \
    "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"

build_kube_router() {
    local out="$kube_router_bin/kube-router" start
    [[ -x "$out" ]] && return 0
    log "building kube-router ($KUBE_ROUTER_MODULE@$KUBE_ROUTER_VERSION) ..."
    start=$SECONDS
    # Outside any module (tmpdir), so `go install module@version` uses kube-router's own go.mod.
    (cd "$tmpdir" && GOBIN="$tmpdir/gobin" nice -n "${E2E_NICE:-10}" "$GO" install -trimpath \
        -ldflags "-s -w -X $KUBE_ROUTER_MODULE/pkg/version.Version=$KUBE_ROUTER_VERSION" \
        "$KUBE_ROUTER_MODULE/cmd/kube-router@$KUBE_ROUTER_VERSION") || die "go install kube-router failed"
    mv -f "$tmpdir/gobin/kube-router" "$out"
    log "built kube-router in $((SECONDS - start))s"
}
build_kube_router

complete || die "build finished but a binary is missing"
log "done"
report
