#!/usr/bin/env bash
# Installs, from Debian, what the e2e cluster and the image build need, each
# package only when it is missing (apt-get update at most once per run).
# Needs root. Idempotent: a second run installs nothing and takes ~1s.
set -euo pipefail
LOG_TAG=e2e-prereqs
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/common.sh
source "$here/../lib/common.sh"

require_root "tools/e2e/prereqs.sh"

# package -> a file it installs (how "missing" is told without asking apt).
PACKAGES=(
    podman:/usr/bin/podman
    runc:/usr/sbin/runc
    containerd:/usr/bin/containerd
    containernetworking-plugins:/usr/lib/cni/bridge
    debootstrap:/usr/sbin/debootstrap
    iptables:/usr/sbin/iptables
    ipset:/usr/sbin/ipset
    conntrack:/usr/sbin/conntrack
    socat:/usr/bin/socat
    ethtool:/usr/sbin/ethtool
    iproute2:/usr/sbin/ip
    kmod:/usr/sbin/modprobe
    uidmap:/usr/bin/newuidmap
    fuse-overlayfs:/usr/bin/fuse-overlayfs
    slirp4netns:/usr/bin/slirp4netns
    ca-certificates:/etc/ssl/certs/ca-certificates.crt
)

missing=()
for entry in "${PACKAGES[@]}"; do
    pkg="${entry%%:*}" file="${entry#*:}"
    [[ -e "$file" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
    log "all prerequisites present"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log "installing: ${missing[*]}"
timed "apt-get update" apt-get update -qq
timed "apt-get install" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts containerd as a service on install; the e2e cluster runs its own
# with its own config and socket, so the packaged one is left stopped.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active -q containerd 2>/dev/null; then
    systemctl stop containerd || true
fi
log "done"
