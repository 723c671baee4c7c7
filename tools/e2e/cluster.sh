#!/usr/bin/env bash
# A throwaway single-node Kubernetes cluster on this host, for the e2e tests:
#
#   cluster.sh up      builds/reuses everything, starts the cluster, imports the
#                      images, waits until the node is Ready; prints KUBECONFIG=...
#   cluster.sh down    stops every process it started, removes pods' network
#                      namespaces, its bridge, its iptables rules and its state
#   cluster.sh env     prints the NAME=value lines `up` printed (cluster running)
#   cluster.sh knative installs Knative Serving and its test ingress (kingress) into the running
#                      cluster; `up` does it too unless E2E_KNATIVE=0
#
# Processes (all host processes, logs in $E2E_RUN_DIR/logs): etcd,
# kube-apiserver, kube-controller-manager (tools/envtest's builds), kube-scheduler,
# containerd 1.6 (Debian) with runc, kubelet, kube-proxy (iptables), CoreDNS
# (as a host process answering on the node address for cluster.local only;
# nothing is forwarded off the host), kube-router with only its firewall
# controller (NetworkPolicy enforcement with iptables and ipset). Pods get
# addresses from the bridge CNI on a bridge of our own; an iptables chain drops
# anything pods send beyond the pod and service ranges, so no pod traffic
# leaves the host.
#
# Needs root, Go (first run), podman and the Debian packages of prereqs.sh.
set -euo pipefail
LOG_TAG=e2e-cluster
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/common.sh
source "$here/../lib/common.sh"

RUN="${E2E_RUN_DIR:-/var/tmp/sessionmem-e2e}"
NODE_NAME=e2e-node
BRIDGE="${E2E_BRIDGE:-sme2e0}"
POD_CIDR="${E2E_POD_CIDR:-10.244.0.0/24}"
NODE_IP="${E2E_NODE_IP:-10.244.0.1}"
SERVICE_CIDR="${E2E_SERVICE_CIDR:-10.96.0.0/24}"
KUBERNETES_SERVICE_IP=10.96.0.1
DNS_SERVICE_IP=10.96.0.10
APISERVER_PORT="${E2E_APISERVER_PORT:-6443}"
ETCD_PORT="${E2E_ETCD_PORT:-23790}"
CHAIN=SESSIONMEM-E2E
# Knative Serving (on unless E2E_KNATIVE=0) and its networking layer, kingress (knative/kingress), a host
# process: external visibility on the node address, port 80; cluster visibility behind a selector-less
# Service (as kube-dns) whose endpoint is the node address, KINGRESS_PRIVATE_PORT.
KNATIVE="${E2E_KNATIVE:-1}"
KINGRESS_CLASS=kingress.e2e.sessionmem.local
KINGRESS_PRIVATE_PORT="${E2E_KINGRESS_PRIVATE_PORT:-8090}"
KNATIVE_DOMAIN=example.com

pki="$RUN/pki"
logs="$RUN/logs"
pids="$RUN/pids"
sock="$RUN/containerd/containerd.sock"

ctr_() { ctr --address "$sock" --namespace k8s.io "$@"; }
kubectl_() { "$KUBECTL" --kubeconfig "$pki/admin.kubeconfig" "$@"; }

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_for() {
    local what="$1" deadline=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out waiting for $what (logs: $logs)"
        sleep 0.5
    done
}

# start NAME COMMAND...: runs COMMAND in the background, its own session, logged.
start() {
    local name="$1"
    shift
    log "starting $name"
    setsid "$@" >"$logs/$name.log" 2>&1 </dev/null &
    printf '%s\n' "$!" >"$pids/$name"
}

running() { [[ -s "$pids/$1" ]] && kill -0 "$(cat "$pids/$1")" 2>/dev/null; }

stop() {
    local name="$1" pid deadline
    [[ -s "$pids/$name" ]] || return 0
    pid="$(cat "$pids/$name")"
    if kill -0 "$pid" 2>/dev/null; then
        log "stopping $name ($pid)"
        kill -TERM "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 15))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pids/$name"
}

load_binaries() {
    local line binaries images envtest
    # Assignments, not process substitutions: a failed build stops `up` here.
    binaries="$(bash "$here/build-binaries.sh")"
    images="$(bash "$here/image.sh")"
    knative="$(bash "$here/build-knative.sh")"
    while IFS= read -r line; do
        [[ "$line" == *=* ]] && export "${line?}"
    done <<<"$binaries"$'\n'"$images"$'\n'"$knative"
    envtest="$(bash "$here/../envtest/ensure-binaries.sh")"
    export ETCD="$envtest/bin/etcd" KUBE_APISERVER="$envtest/bin/kube-apiserver"
    export KUBE_CONTROLLER_MANAGER="$envtest/bin/kube-controller-manager"
}

# cert NAME SUBJECT [SAN]: a key and a CA-signed certificate in $pki.
cert() {
    local name="$1" subject="$2" san="${3:-}" ext="$pki/$1.ext"
    openssl genrsa -out "$pki/$name.key" 2048 2>/dev/null
    openssl req -new -key "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr" 2>/dev/null
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=serverAuth,clientAuth"
        [[ -z "$san" ]] || echo "subjectAltName=$san"
    } >"$ext"
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -days 7 -sha256 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
    rm -f "$pki/$name.csr" "$ext"
}

kubeconfig() {
    local name="$1"
    cat >"$pki/$name.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: "https://$NODE_IP:$APISERVER_PORT", certificate-authority: "$pki/ca.crt"}
users:
- name: $name
  user: {client-certificate: "$pki/$name.crt", client-key: "$pki/$name.key"}
contexts:
- name: e2e
  context: {cluster: e2e, user: $name}
current-context: e2e
KC
}

make_pki() {
    mkdir -p "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 7 \
        -subj "/CN=sessionmem-e2e-ca" 2>/dev/null
    cert apiserver "/CN=kube-apiserver" \
        "IP:$NODE_IP,IP:$KUBERNETES_SERVICE_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert admin "/O=system:masters/CN=e2e-admin"
    cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
    cert kubelet-serving "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
    cert kube-scheduler "/CN=system:kube-scheduler"
    cert kube-controller-manager "/CN=system:kube-controller-manager"
    cert kube-proxy "/CN=system:kube-proxy"
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    local n
    for n in admin kubelet kube-scheduler kube-controller-manager kube-proxy; do kubeconfig "$n"; done
}

network_up() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
    fi
    ip addr replace "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    sysctl -qw net.ipv4.ip_forward=1
    sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
    # Pods may talk to pods, services and this host; anything else they send
    # (the host's own network, the internet) is dropped before it is routed.
    # In the mangle table, which sees forwarded packets before the filter table:
    # kube-router keeps its own jump first in filter FORWARD and ACCEPTs there
    # what NetworkPolicies allow, so a rule of ours in filter FORWARD would never
    # see those packets.
    iptables -t mangle -N "$CHAIN" 2>/dev/null || iptables -t mangle -F "$CHAIN"
    iptables -t mangle -A "$CHAIN" -s "$POD_CIDR" -d "$POD_CIDR" -j RETURN
    iptables -t mangle -A "$CHAIN" -s "$POD_CIDR" -j DROP
    iptables -t mangle -C FORWARD -j "$CHAIN" 2>/dev/null || iptables -t mangle -I FORWARD 1 -j "$CHAIN"
    # This host's own connections to a Service IP (the tests') must never leave it: before kube-proxy
    # has programmed a Service, a ClusterIP is just a private address, and the default route would
    # carry it off the host. The Service range is routed onto our bridge (so kube-proxy's DNAT still
    # applies to local connections), and whatever is still addressed to it after DNAT is refused here.
    ip route replace "$SERVICE_CIDR" dev "$BRIDGE"
    iptables -C OUTPUT -d "$SERVICE_CIDR" -j REJECT 2>/dev/null || iptables -I OUTPUT 1 -d "$SERVICE_CIDR" -j REJECT
    mkdir -p "$RUN/cni/net.d" "$RUN/cni/ipam"
    cat >"$RUN/cni/net.d/10-sessionmem-e2e.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "sessionmem-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$RUN/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CNI
}

# kube-proxy --cleanup removes its own rules; the kubelet's (KUBE-FIREWALL,
# KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) stay: remove every KUBE-* chain and
# the jumps to them. Nothing else on this host makes KUBE-* chains.
kube_chains_down() {
    local cmd table rule chain
    for cmd in iptables ip6tables; do
        for table in filter nat mangle; do
            "$cmd" -t "$table" -S 2>/dev/null | { grep -E '^-A [A-Z]+ .*-j KUBE-' || true; } | while read -r rule; do
                # iptables -S quotes comments as a shell would: eval reads them back.
                eval "$cmd -t $table ${rule/#-A/-D}" 2>/dev/null || true
            done
            for chain in $("$cmd" -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
                "$cmd" -t "$table" -F "$chain" 2>/dev/null || true
            done
            for chain in $("$cmd" -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
                "$cmd" -t "$table" -X "$chain" 2>/dev/null || true
            done
        done
    done
}

# kube-router's firewall controller keeps pod and policy addresses in ipsets
# (KUBE-SRC-*, KUBE-DST-*, and TMP-<16 base32> while it swaps them); its
# iptables chains are KUBE-* chains, which kube_chains_down removes first.
kube_router_ipsets_down() {
    command -v ipset >/dev/null 2>&1 || return 0
    local set
    for set in $(ipset list -n 2>/dev/null | grep -E '^(inet6:)?(KUBE-(SRC|DST)-[A-Z0-9]+|TMP-[A-Z2-7]{16})$' || true); do
        ipset destroy "$set" 2>/dev/null || true
    done
}

network_down() {
    kube_chains_down
    kube_router_ipsets_down
    iptables -t mangle -D FORWARD -j "$CHAIN" 2>/dev/null || true
    iptables -t mangle -F "$CHAIN" 2>/dev/null || true
    iptables -t mangle -X "$CHAIN" 2>/dev/null || true
    # Where runs before this one kept the chain (filter table).
    iptables -D FORWARD -j "$CHAIN" 2>/dev/null || true
    iptables -F "$CHAIN" 2>/dev/null || true
    iptables -X "$CHAIN" 2>/dev/null || true
    iptables -D OUTPUT -d "$SERVICE_CIDR" -j REJECT 2>/dev/null || true
    ip route del "$SERVICE_CIDR" dev "$BRIDGE" 2>/dev/null || true
    ip link del "$BRIDGE" 2>/dev/null || true
}

containerd_config() {
    mkdir -p "$RUN/containerd"
    cat >"$RUN/containerd/config.toml" <<TOML
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
[grpc]
  address = "$sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  # Lowering a process's oom_score_adj is refused on this kind of host (the
  # pause container's -998 fails runc with "failed to update
  # /proc/self/oom_score_adj: Permission denied"): clamp to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUN/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni/net.d"
TOML
}

kubelet_config() {
    mkdir -p "$RUN/kubelet"
    : >"$RUN/kubelet/resolv.conf"
    cat >"$RUN/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$pki/kubelet-serving.crt"
tlsPrivateKeyFile: "$pki/kubelet-serving.key"
containerRuntimeEndpoint: "unix://$sock"
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# Lowering an oom_score_adj is refused here: the kubelet keeps the one it has.
oomScoreAdj: 0
clusterDomain: cluster.local
clusterDNS: ["$DNS_SERVICE_IP"]
resolvConf: "$RUN/kubelet/resolv.conf"
podLogsDir: "$RUN/pod-logs"
# A shared development machine: never evict for its disk or memory use.
evictionHard: {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
podCIDR: "$POD_CIDR"
maxPods: 60
YAML
}

kube_router_in_place() { iptables -S FORWARD | grep -q -- '-j KUBE-ROUTER-FORWARD'; }

kube_proxy_config() {
    mkdir -p "$RUN/kube-proxy"
    cat >"$RUN/kube-proxy/config.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: "$POD_CIDR"
hostnameOverride: $NODE_NAME
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection: {kubeconfig: "$pki/kube-proxy.kubeconfig"}
# Leave the host's conntrack sysctls alone.
conntrack: {maxPerCore: 0, min: 0}
YAML
}

coredns_config() {
    mkdir -p "$RUN/coredns"
    cat >"$RUN/coredns/Corefile" <<COREFILE
.:53 {
    bind $NODE_IP
    errors
    health 127.0.0.1:18080
    ready 127.0.0.1:18181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $pki/admin.kubeconfig e2e
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loadbalance
}
COREFILE
}

# The cluster's DNS is a host process: kube-dns is a Service without selector
# whose EndpointSlice names the node address CoreDNS binds.
dns_service() {
    kubectl_ apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_SERVICE_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: sessionmem-e2e}
addressType: IPv4
endpoints:
- addresses: ["$NODE_IP"]
  conditions: {ready: true}
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
YAML
}

print_env() {
    printf 'KUBECONFIG=%s\nKUBECTL=%s\nSESSIONMEM_IMAGE=%s\nVALKEY_IMAGE=%s\nDEMO_AGENT_IMAGE=%s\nE2E_RUN_DIR=%s\n' \
        "$pki/admin.kubeconfig" "$KUBECTL" "$SESSIONMEM_IMAGE" "$VALKEY_IMAGE" "$DEMO_AGENT_IMAGE" "$RUN"
    if running kingress; then
        printf 'KNATIVE_VERSION=%s\nKNATIVE_INGRESS=http://%s:80\nKNATIVE_DOMAIN=%s\n' \
            "$KNATIVE_VERSION" "$NODE_IP" "$KNATIVE_DOMAIN"
    fi
}

# Knative Serving from its release manifests (build-knative.sh's module zips, rendered by its `manifests`
# tool with our images and lowered requests), and kingress as its networking layer.
knative_up() {
    local dir="$RUN/knative" args=() pair t0=$SECONDS deployment
    mkdir -p "$dir"
    timed "import $(basename "$KNATIVE_IMAGES_ARCHIVE")" ctr_ images import --no-unpack=false "$KNATIVE_IMAGES_ARCHIVE" >/dev/null
    IFS=, read -ra pairs <<<"$KNATIVE_IMAGES"
    for pair in "${pairs[@]}"; do args+=(-image "$pair"); done
    "$KNATIVE_MANIFESTS" -serving "$KNATIVE_SERVING_DIR" -networking "$KNATIVE_NETWORKING_DIR" \
        -caching "$KNATIVE_CACHING_DIR" -crds "$dir/crds.yaml" -out "$dir/serving.yaml" "${args[@]}" \
        -config "config-network.ingress-class=$KINGRESS_CLASS" \
        -config "config-domain.$KNATIVE_DOMAIN=" \
        -config "config-deployment.registries-skipping-tag-resolving=kind.local,ko.local,dev.local,index.docker.io" \
        -config "config-deployment.queue-sidecar-cpu-request=10m" \
        || die "rendering Knative's manifests failed"
    # Server-side: Knative's CRDs are too large for kubectl's last-applied annotation.
    kubectl_ apply --server-side --force-conflicts -f "$dir/crds.yaml" >/dev/null
    kubectl_ wait --for=condition=Established crd --all --timeout=60s >/dev/null
    kubectl_ apply --server-side --force-conflicts -f "$dir/serving.yaml" >/dev/null
    kubectl_ apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: kingress-private, namespace: knative-serving}
spec:
  ports: [{name: http, port: 80, protocol: TCP, targetPort: $KINGRESS_PRIVATE_PORT}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kingress-private-host
  namespace: knative-serving
  labels: {kubernetes.io/service-name: kingress-private, endpointslice.kubernetes.io/managed-by: sessionmem-e2e}
addressType: IPv4
endpoints:
- addresses: ["$NODE_IP"]
  conditions: {ready: true}
ports:
- {name: http, port: $KINGRESS_PRIVATE_PORT, protocol: TCP}
YAML
    running kingress || start kingress "$KINGRESS" --kubeconfig="$pki/admin.kubeconfig" --ingress-class="$KINGRESS_CLASS" \
        --public-addr="$NODE_IP:80" --private-addr="$NODE_IP:$KINGRESS_PRIVATE_PORT" --public-ip="$NODE_IP" \
        --private-domain=kingress-private.knative-serving.svc.cluster.local --dns="$NODE_IP:53"
    for deployment in controller activator autoscaler webhook; do
        kubectl_ rollout status "deployment/$deployment" -n knative-serving --timeout=300s >/dev/null \
            || die "Knative's $deployment did not roll out (logs: $logs)"
    done
    running kingress || die "kingress exited (logs: $logs/kingress.log)"
    # The webhook registers itself (its CA bundle) once up: a server-side dry run goes through it.
    cat >"$dir/probe.yaml" <<YAML
apiVersion: serving.knative.dev/v1
kind: Service
metadata: {name: webhook-probe, namespace: default}
spec:
  template:
    spec:
      containers: [{image: "${KNATIVE_IMAGES##*queue=}"}]
YAML
    wait_for "Knative's webhook" 120 kubectl_ apply --dry-run=server -f "$dir/probe.yaml"
    log "Knative Serving $KNATIVE_VERSION up in $((SECONDS - t0))s"
}

up() {
    require_root "tools/e2e/cluster.sh up"
    bash "$here/prereqs.sh"
    load_binaries
    if running kube-apiserver && running kubelet; then
        log "cluster already running in $RUN"
        print_env | tee "$RUN/env"
        return 0
    fi
    [[ ! -e "$RUN" ]] || down
    mkdir -p "$RUN" "$logs" "$pids"
    local t0=$SECONDS
    make_pki
    network_up

    start etcd "$ETCD" --name=e2e --data-dir="$RUN/etcd" \
        --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls="http://127.0.0.1:$((ETCD_PORT + 10))" \
        --initial-advertise-peer-urls="http://127.0.0.1:$((ETCD_PORT + 10))" \
        --initial-cluster="e2e=http://127.0.0.1:$((ETCD_PORT + 10))" \
        --unsafe-no-fsync=true --log-level=warn
    start kube-apiserver "$KUBE_APISERVER" \
        --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
        --bind-address="$NODE_IP" --advertise-address="$NODE_IP" --secure-port="$APISERVER_PORT" \
        --cert-dir="$RUN/apiserver" \
        --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
        --client-ca-file="$pki/ca.crt" \
        --kubelet-client-certificate="$pki/admin.crt" --kubelet-client-key="$pki/admin.key" \
        --kubelet-certificate-authority="$pki/ca.crt" \
        --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
        --service-account-issuer="https://kubernetes.default.svc.cluster.local" \
        --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
        --kubelet-preferred-address-types=InternalIP \
        --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true --profiling=false --v=1
    wait_for "kube-apiserver /readyz" 120 curl -sfk --cacert "$pki/ca.crt" \
        --cert "$pki/admin.crt" --key "$pki/admin.key" "https://$NODE_IP:$APISERVER_PORT/readyz"
    start kube-controller-manager "$KUBE_CONTROLLER_MANAGER" \
        --kubeconfig="$pki/kube-controller-manager.kubeconfig" \
        --authentication-kubeconfig="$pki/kube-controller-manager.kubeconfig" \
        --authorization-kubeconfig="$pki/kube-controller-manager.kubeconfig" \
        --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
        --use-service-account-credentials=true --leader-elect=false --secure-port=0 \
        --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
        --service-cluster-ip-range="$SERVICE_CIDR" --v=1
    start kube-scheduler "$KUBE_SCHEDULER" --kubeconfig="$pki/kube-scheduler.kubeconfig" \
        --authentication-kubeconfig="$pki/kube-scheduler.kubeconfig" \
        --authorization-kubeconfig="$pki/kube-scheduler.kubeconfig" \
        --leader-elect=false --secure-port=0 --v=1

    containerd_config
    start containerd containerd --config "$RUN/containerd/config.toml"
    wait_for "containerd" 60 ctr_ version
    local archive
    for archive in "$PAUSE_IMAGE_ARCHIVE" "$SESSIONMEM_IMAGE_ARCHIVE" "$VALKEY_IMAGE_ARCHIVE" "$DEMO_AGENT_IMAGE_ARCHIVE"; do
        timed "import $(basename "$archive")" ctr_ images import --no-unpack=false "$archive" >/dev/null
    done

    kubelet_config
    start kubelet "$KUBELET" --config="$RUN/kubelet/config.yaml" --kubeconfig="$pki/kubelet.kubeconfig" \
        --root-dir="$RUN/kubelet/root" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1
    kube_proxy_config
    start kube-proxy "$KUBE_PROXY" --config="$RUN/kube-proxy/config.yaml" --v=1
    coredns_config
    start coredns "$COREDNS" -conf "$RUN/coredns/Corefile"

    wait_for "node $NODE_NAME Ready" 180 kubectl_ wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
    # NetworkPolicies: kube-router's firewall controller only (no routing, no service proxy: the bridge
    # CNI and kube-proxy do those), once the node it enforces them on exists. Admin credentials, as
    # CoreDNS: a host process of the test cluster.
    start kube-router "$KUBE_ROUTER" --kubeconfig="$pki/admin.kubeconfig" --hostname-override="$NODE_NAME" \
        --run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
        --service-cluster-ip-range="$SERVICE_CIDR" --enable-ipv4=true --enable-ipv6=false \
        --health-port=0 --metrics-port=0 --v=1
    # Its first full sync installs its jumps in the filter table's FORWARD chain.
    wait_for "kube-router's firewall" 60 kube_router_in_place
    running kube-router || die "kube-router exited (logs: $logs/kube-router.log)"
    dns_service
    wait_for "default ServiceAccount" 60 kubectl_ get serviceaccount default -n default
    log "cluster up in $((SECONDS - t0))s"
    [[ "$KNATIVE" == 0 ]] || knative_up
    print_env | tee "$RUN/env"
}

down() {
    require_root "tools/e2e/cluster.sh down"
    mkdir -p "$pids"
    # Let the kubelet tear the pods down (CNI DEL, network namespaces) first.
    if running kubelet && running kube-apiserver && [[ -n "${KUBECTL:-}" ]]; then
        kubectl_ delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
        # Stopped sandboxes have had their CNI DEL and lost their namespaces; the
        # kubelet removes dead containers only later, so running tasks are what counts.
        local deadline=$((SECONDS + 60))
        while ((SECONDS < deadline)) && ctr_ tasks list 2>/dev/null | grep -q RUNNING; do sleep 0.5; done
    fi
    local name
    for name in kingress kube-router coredns kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver; do
        stop "$name"
    done
    # Whatever is left: kill the tasks, remove the sandboxes' network namespaces.
    if running containerd; then
        local task
        for task in $(ctr_ tasks list -q 2>/dev/null); do
            ctr_ tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
            ctr_ tasks delete -f "$task" >/dev/null 2>&1 || true
        done
    fi
    stop containerd
    reap_leftovers
    stop etcd
    [[ -n "${KUBE_PROXY:-}" ]] && "$KUBE_PROXY" --cleanup >/dev/null 2>&1 || true
    network_down
    # kubelet and containerd mount volumes and root filesystems under $RUN.
    local mnt
    for mnt in $(awk -v r="$RUN" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do
        umount -l "$mnt" 2>/dev/null || true
    done
    rm -rf "$RUN"
    log "cluster down"
}

# What a crashed or interrupted run leaves: containerd shims (they outlive
# containerd; ours name our socket) with their containers, and the pods'
# network namespaces (ours hold an address in the pod range).
reap_leftovers() {
    local shim child ns prefix
    for shim in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock" || true); do
        for child in $(pgrep -P "$shim" || true); do
            kill -KILL "$child" 2>/dev/null || true # a pod's PID 1: its namespace goes with it
        done
        kill -KILL "$shim" 2>/dev/null || true
    done
    prefix="${POD_CIDR%/*}"
    prefix="inet ${prefix%.*}."
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        if ip -n "$ns" -4 -o addr show 2>/dev/null | grep -qF "$prefix"; then
            ip netns delete "$ns" 2>/dev/null || true
        fi
    done
    # A CRI namespace file whose mount is gone (a sandbox killed mid-teardown) is nobody's.
    for ns in /var/run/netns/cni-*; do
        [[ -f "$ns" ]] && ! mountpoint -q "$ns" && rm -f "$ns"
    done
    return 0
}

case "${1:-}" in
up) up ;;
down)
    if [[ -d "$RUN" ]]; then
        KUBECTL="$(bash "$here/build-binaries.sh" | sed -n 's/^KUBECTL=//p')"
        KUBE_PROXY="$(bash "$here/build-binaries.sh" | sed -n 's/^KUBE_PROXY=//p')"
    fi
    down
    ;;
env) running kube-apiserver && running kubelet && cat "$RUN/env" ;;
knative)
    # Knative Serving into the running cluster (what `up` does unless E2E_KNATIVE=0); idempotent.
    require_root "tools/e2e/cluster.sh knative"
    running kube-apiserver && running kubelet || die "the cluster is not running (cluster.sh up)"
    load_binaries
    knative_up
    print_env | tee "$RUN/env"
    ;;
*) die "usage: $0 up|down|env|knative" ;;
esac
