#!/usr/bin/env bash
# Makes (once) the Python base image the e2e builds the project's image FROM:
# no registry image can be pulled here, so a Debian root filesystem is made with
# debootstrap from Debian's packages and imported into podman's storage.
#
#   cache: ${SESSIONMEM_CACHE_DIR:-~/.cache/sessionmem}/e2e/base-<key>/rootfs.tar
#   image: localhost/sessionmem-e2e-python:<key>
#
# <key> names the suite and hashes the package list, the mirror and
# BASE_REVISION, so a change of any makes a new image. Prints the image name (stdout, one line).
# Needs root and podman (tools/e2e/prereqs.sh).
set -euo pipefail
LOG_TAG=e2e-base
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/common.sh
source "$here/../lib/common.sh"

SUITE="${E2E_BASE_SUITE:-bookworm}"
MIRROR="${E2E_BASE_MIRROR:-http://deb.debian.org/debian}"
INCLUDE="python3,python3-venv,ca-certificates"

# Bump when the way the root filesystem is made changes (a new key, a new image).
BASE_REVISION=1
key="$SUITE-$(printf '%s\n%s\n%s\n' "$INCLUDE" "$MIRROR" "$BASE_REVISION" | sha256sum | cut -c1-12)"
image="localhost/sessionmem-e2e-python:$key"
dest="$(cache_root)/e2e/base-$key"

if podman_ image exists "$image"; then
    printf '%s\n' "$image"
    exit 0
fi
require_root "tools/e2e/base-image.sh"
mkdir -p "$dest"
lock_or_wait "$dest/.lock"
if podman_ image exists "$image"; then
    printf '%s\n' "$image"
    exit 0
fi

if [[ ! -s "$dest/rootfs.tar" ]]; then
    rm -rf "$dest"/.tmp.*
    tmpdir="$(mktemp -d "$dest/.tmp.XXXXXX")"
    trap 'rm -rf "$tmpdir"' EXIT
    log "debootstrap $SUITE (minbase + $INCLUDE) from $MIRROR"
    run_debootstrap() {
        debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$tmpdir/rootfs" "$MIRROR" \
            >"$tmpdir/debootstrap.log" 2>&1 \
            || { tail -n 20 "$tmpdir/debootstrap.log" >&2; die "debootstrap failed"; }
    }
    timed "debootstrap" run_debootstrap
    # Downloaded .debs and package lists are no part of an image.
    rm -rf "$tmpdir"/rootfs/var/cache/apt/archives/*.deb "$tmpdir"/rootfs/var/lib/apt/lists/*
    timed "tar rootfs" tar --numeric-owner -C "$tmpdir/rootfs" -cf "$tmpdir/rootfs.tar" .
    mv -f "$tmpdir/rootfs.tar" "$dest/rootfs.tar"
fi

log "importing $dest/rootfs.tar as $image"
timed "podman import" podman_ import --quiet --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' \
    "$dest/rootfs.tar" "$image" >/dev/null
printf '%s\n' "$image"
