#!/usr/bin/env bash
# Runs knative.dev/networking's KIngress conformance suite (test/conformance/ingress, at the version
# knative/go.mod resolves) against kingress in the running e2e cluster (cluster.sh up, with Knative), and
# prints one PASS/FAIL/SKIP line per part. Not part of `make e2e`: `make e2e-knative-conformance`.
#
#   CONFORMANCE_TESTS="basics update ..."   the suite's stable parts to run (the rest are skipped)
#
# Builds, cached in $cache/e2e/knative-conformance-<networking version>-<key>/: the suite's test binary
# (`go test -c -tags e2e`) and its backends (test/test_images: runtime, httpproxy, ...) in one `go build`,
# each backend a static binary in an empty image tagged under dev.local, imported into the node.
set -euo pipefail
LOG_TAG=e2e-conformance
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/common.sh
source "$here/../lib/common.sh"

require_root "tools/e2e/knative-conformance.sh"
cluster_env="$(bash "$here/cluster.sh" env)" || die "the e2e cluster is not running (tools/e2e/cluster.sh up)"
while IFS= read -r line; do [[ "$line" == *=* ]] && export "${line?}"; done <<<"$cluster_env"
[[ -n "${KNATIVE_INGRESS:-}" ]] || die "the e2e cluster runs without Knative (tools/e2e/cluster.sh knative)"

# The suite's stable parts (run.go); the issue asks for basics, headers, hosts, path, percentage, update
# and visibility.
ALL=(basics basics/http2 grpc grpc/split headers/pre-split headers/post-split headers/probe hosts/multiple
    dispatch/path dispatch/percentage dispatch/path_and_percentage dispatch/rule retry timeout tls update
    visibility visibility/split visibility/path ingressclass websocket websocket/split)
read -ra WANTED <<<"${CONFORMANCE_TESTS:-basics headers/pre-split headers/post-split headers/probe hosts/multiple dispatch/path dispatch/percentage dispatch/path_and_percentage dispatch/rule update visibility visibility/split visibility/path ingressclass}"
BACKENDS=(runtime httpproxy timeout wsserver grpc-ping retry)
KINGRESS_CLASS=kingress.e2e.sessionmem.local # cluster.sh's

mod="$here/knative"
NETWORKING_VERSION="$(modver "$mod/go.mod" knative.dev/networking)"
key="$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-8)"
dir="$(cache_root)/e2e/knative-conformance-$NETWORKING_VERSION-$key"
GO="$(find_go)"
go_build_env
mkdir -p "$dir/bin"
lock_or_wait "$dir/.lock"
if [[ ! -x "$dir/bin/ingress.test" ]]; then
    tmp="$(mktemp -d "$dir/.tmp.XXXXXX")"
    packages=()
    for b in "${BACKENDS[@]}"; do packages+=("knative.dev/networking/test/test_images/$b"); done
    log "building the conformance suite and its backends (knative.dev/networking $NETWORKING_VERSION) ..."
    start=$SECONDS
    (cd "$mod" && nice -n "${E2E_NICE:-10}" "$GO" build -trimpath -ldflags "-s -w" -o "$tmp/" "${packages[@]}" &&
        nice -n "${E2E_NICE:-10}" "$GO" test -c -tags e2e -trimpath -ldflags "-s -w" -o "$tmp/ingress.test" \
            knative.dev/networking/test/conformance/ingress) || { rm -rf "$tmp"; die "go build failed"; }
    mv -f "$tmp"/* "$dir/bin/"
    rm -rf "$tmp"
    log "built in $((SECONDS - start))s"
fi

tag="$(cd "$dir/bin" && cat "${BACKENDS[@]}" | sha256sum | cut -c1-12)"
repo=dev.local/sessionmem-e2e/knative-test
archive="$dir/backends-$tag.tar"
if [[ ! -s "$archive" ]]; then
    refs=()
    for b in "${BACKENDS[@]}"; do
        refs+=("$repo/$b:$tag")
        podman_ image exists "$repo/$b:$tag" && continue
        ctx="$(mktemp -d "$dir/.tmp.XXXXXX")"
        cp "$dir/bin/$b" "$ctx/$b"
        printf 'FROM scratch\nCOPY %s /%s\nENTRYPOINT ["/%s"]\n' "$b" "$b" "$b" >"$ctx/Containerfile"
        podman_ build --quiet --pull=never --tag "$repo/$b:$tag" "$ctx" >/dev/null
        rm -rf "$ctx"
    done
    podman_ save --quiet --multi-image-archive --format docker-archive -o "$archive.tmp" "${refs[@]}"
    mv -f "$archive.tmp" "$archive"
fi
ctr --address "$E2E_RUN_DIR/containerd/containerd.sock" --namespace k8s.io images import "$archive" >/dev/null

skip=()
for name in "${ALL[@]}"; do
    [[ " ${WANTED[*]} " == *" $name "* ]] || skip+=("$name")
done
"$KUBECTL" --kubeconfig "$KUBECONFIG" create namespace serving-tests --dry-run=client -o yaml \
    | "$KUBECTL" --kubeconfig "$KUBECONFIG" apply -f - >/dev/null
out="$E2E_RUN_DIR/logs/conformance.log"
log "running ${WANTED[*]} (log: $out)"
rc=0
(cd "$dir" && "$dir/bin/ingress.test" -test.v -test.run '^TestIngressConformance$' -test.timeout 20m \
    -test.parallel "${CONFORMANCE_PARALLEL:-4}" \
    -kubeconfig "$KUBECONFIG" -ingressClass "$KINGRESS_CLASS" -dockerrepo "$repo" -tag "$tag" \
    -skip-tests "$(IFS=,; printf '%s' "${skip[*]}")") >"$out" 2>&1 || rc=$?
# One line per part: the suite's own top-level verdicts.
grep -E '^    --- (PASS|FAIL|SKIP): TestIngressConformance/' "$out" | sed 's/^    --- //' | sort -k2
exit "$rc"
