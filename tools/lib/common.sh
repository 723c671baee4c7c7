# Shell helpers shared by the build and e2e scripts under tools/ (sourced, never run).
# A script sets LOG_TAG before sourcing, for its log prefix.

log() { printf '[%s] %s\n' "${LOG_TAG:-tools}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Version of a required module, read straight from a go.mod (no go needed).
modver() {
    local gomod="$1" mod="$2" v
    v="$(awk -v m="$mod" '($1 == "require" && $2 == m) {print $3; exit} ($1 == m) {print $2; exit}' "$gomod")"
    [[ -n "$v" ]] || die "cannot find $mod in $gomod"
    printf '%s' "$v"
}

cache_root() { printf '%s' "${SESSIONMEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sessionmem}"; }

require_root() {
    [[ "$(id -u)" == 0 ]] || die "$1 needs root (run it as root or with sudo)"
}

# Takes an exclusive lock on "$1" on fd 9, waiting (and saying so) if another holds it.
lock_or_wait() {
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>"$1"
    if ! flock -n 9; then
        log "another run holds $1; waiting for it"
        flock 9
    fi
}

find_go() {
    if [[ -n "${GO:-}" ]]; then printf '%s' "$GO"; return; fi
    if command -v go >/dev/null 2>&1; then command -v go
    elif [[ -x /usr/local/go/bin/go ]]; then printf '%s' /usr/local/go/bin/go
    else die "go toolchain not found (set GO=/path/to/go)"
    fi
}

# Static, reproducible Go builds without VCS stamping.
go_build_env() {
    export CGO_ENABLED=0 GOWORK=off
    GOFLAGS="${GOFLAGS:--buildvcs=false}"
    case " $GOFLAGS " in *" -buildvcs="*) ;; *) GOFLAGS="$GOFLAGS -buildvcs=false" ;; esac
    export GOFLAGS
}

# Runs "$@" and logs how long it took, under the label $1.
timed() {
    local label="$1" start=$SECONDS
    shift
    "$@"
    log "$label: $((SECONDS - start))s"
}

# podman as it works on this kind of host: crun fails on hybrid (v1) cgroups and
# there is no systemd to manage cgroups, so runc and cgroupfs.
podman_() { podman --runtime runc --cgroup-manager cgroupfs "$@"; }

# Container limits must stay at or below the caller's own: raising one is refused.
PODMAN_ULIMITS=(--ulimit nofile=20000:20000 --ulimit nproc=4096:4096)
