{{/* Names ------------------------------------------------------------------------------------------ */}}

{{- define "sessionmem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-wide base name; components append -operator, -proxy, -valkey (so it stays <= 45 chars). */}}
{{- define "sessionmem.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sessionmem.operator.fullname" -}}{{ include "sessionmem.fullname" . }}-operator{{- end -}}
{{- define "sessionmem.proxy.fullname" -}}{{ include "sessionmem.fullname" . }}-proxy{{- end -}}
{{- define "sessionmem.valkey.fullname" -}}{{ include "sessionmem.fullname" . }}-valkey{{- end -}}
{{- define "sessionmem.valkey.secretName" -}}
{{- .Values.valkey.auth.existingSecret | default (printf "%s-auth" (include "sessionmem.valkey.fullname" .)) -}}
{{- end -}}
{{- define "sessionmem.encryption.keyringSecret" -}}
{{- .Values.proxy.encryption.keyringSecret | default (printf "%s-keyring" (include "sessionmem.proxy.fullname" .)) -}}
{{- end -}}

{{- define "sessionmem.encryption.dataKeyNamespace" -}}
{{- .Values.proxy.encryption.dataKeyNamespace | default .Release.Namespace -}}
{{- end -}}

{{- define "sessionmem.capabilityKey.secretName" -}}
{{- .Values.proxy.capabilityKey.existingSecret | default (printf "%s-capability-key" (include "sessionmem.proxy.fullname" .)) -}}
{{- end -}}

{{/* Labels ----------------------------------------------------------------------------------------- */}}

{{- define "sessionmem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sessionmem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sessionmem.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sessionmem.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sessionmem
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of one component: include "sessionmem.componentLabels" (list . "proxy") */}}
{{- define "sessionmem.componentLabels" -}}
{{ include "sessionmem.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "sessionmem.componentSelector" -}}
{{ include "sessionmem.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Images ----------------------------------------------------------------------------------------- */}}

{{/*
An image reference from {registry, repository, tag, digest}: include "sessionmem.imageRef" (list $ .Values.image
defaultTag). global.imageRegistry, then the image's own registry, replaces the registry the repository names
(its first part when that has a "." or ":" or is localhost, as container runtimes read it); neither set: the
repository as written. A digest pins the image and the tag is ignored.
*/}}
{{- define "sessionmem.imageRef" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $registry := (($root.Values.global).imageRegistry) | default $image.registry | default "" | trimSuffix "/" -}}
{{- $repository := $image.repository -}}
{{- if $registry -}}
{{- $first := regexFind "^[^/]+" $repository -}}
{{- if and (contains "/" $repository) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = regexReplaceAll "^[^/]+/" $repository "" -}}
{{- end -}}
{{- $repository = printf "%s/%s" $registry $repository -}}
{{- end -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository ($image.tag | default (index . 2)) -}}
{{- end -}}
{{- end -}}

{{- define "sessionmem.image" -}}
{{- include "sessionmem.imageRef" (list . .Values.image .Chart.AppVersion) -}}
{{- end -}}

{{- define "sessionmem.launcherImage" -}}
{{- .Values.operator.launcher.image | default (include "sessionmem.image" .) -}}
{{- end -}}

{{- define "sessionmem.valkey.image" -}}
{{- include "sessionmem.imageRef" (list . .Values.valkey.image .Values.valkey.image.tag) -}}
{{- end -}}

{{/* ServiceAccounts -------------------------------------------------------------------------------- */}}

{{/*
The ServiceAccount a component runs as: include "sessionmem.serviceAccountName" (list $ "proxy"). Created by
the chart (default name <fullname>-<component>), or an existing one named by <component>.serviceAccount.name;
the chart's RBAC binds whichever it is. Never the namespace's default account by omission.
*/}}
{{- define "sessionmem.serviceAccountName" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- $account := (index $root.Values $component).serviceAccount -}}
{{- if $account.create -}}
{{- $account.name | default (printf "%s-%s" (include "sessionmem.fullname" $root) $component) -}}
{{- else -}}
{{- required (printf "%s.serviceAccount.name is required when %s.serviceAccount.create is false" $component $component) $account.name -}}
{{- end -}}
{{- end -}}

{{/* URLs ------------------------------------------------------------------------------------------- */}}

{{- define "sessionmem.proxy.host" -}}
{{- printf "%s.%s.svc.%s" (include "sessionmem.proxy.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* The proxy URL the operator hands to agent pods: "" (the default; null too) means this release's proxy
Service; "none" means none, and the operator then reports MemoryReady=False (NoProxyConfigured) on every
agent. Not null for the default: Helm's --reuse-values keeps a --set key=null for one upgrade too long,
so going back to the default took two runs. */}}
{{- define "sessionmem.proxy.own" -}}
{{- if not .Values.operator.proxyUrl -}}true{{- end -}}
{{- end -}}

{{- define "sessionmem.proxy.url" -}}
{{- if include "sessionmem.proxy.own" . -}}
{{- printf "http://%s:%d" (include "sessionmem.proxy.host" .) (int .Values.proxy.port) -}}
{{- else if ne .Values.operator.proxyUrl "none" -}}
{{- .Values.operator.proxyUrl | trimSuffix "/" -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret holding the Valkey password for the proxy, or "" when Valkey has none. */}}
{{- define "sessionmem.valkeyPasswordSecret" -}}
{{- if .Values.valkey.enabled -}}
{{- include "sessionmem.valkey.secretName" . -}}
{{- else -}}
{{- .Values.externalValkey.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "sessionmem.valkeyPasswordKey" -}}
{{- if .Values.valkey.enabled -}}
{{- .Values.valkey.auth.existingSecretPasswordKey | default "password" -}}
{{- else -}}
{{- .Values.externalValkey.existingSecretPasswordKey | default "password" -}}
{{- end -}}
{{- end -}}

{{/*
SESSIONMEM_VALKEY_URL for the proxy. The password is never part of the values or of the manifest: the
URL holds $(VALKEY_PASSWORD), which the kubelet substitutes from the env var of that name (a secretKeyRef)
defined before it in the container.
*/}}
{{- define "sessionmem.valkey.url" -}}
{{- include "sessionmem.valkey.baseUrl" . -}}{{- include "sessionmem.valkey.tlsQuery" . -}}
{{- end -}}

{{- define "sessionmem.valkey.baseUrl" -}}
{{- if .Values.valkey.enabled -}}
{{- printf "%s://%s:$(VALKEY_PASSWORD)@%s.%s.svc.%s:6379/0" (ternary "valkeys" "valkey" .Values.valkey.tls.enabled) .Values.valkey.username (include "sessionmem.valkey.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- else -}}
{{- $raw := required "externalValkey.url is required when valkey.enabled is false" .Values.externalValkey.url -}}
{{- /* Parsed by hand: a cluster URL lists several host:port seeds, which no URL parser accepts. */ -}}
{{- $scheme := regexFind "^[a-z+]+" $raw -}}
{{- $userinfo := "" -}}
{{- if regexMatch "^[a-z+]+://[^@/]*@" $raw -}}
{{- $userinfo = regexReplaceAll "^[a-z+]+://([^@/]*)@.*$" $raw "${1}" -}}
{{- end -}}
{{- if contains ":" $userinfo -}}
{{- fail "externalValkey.url must not contain a password: put it in the Secret named by externalValkey.existingSecret" -}}
{{- end -}}
{{- if .Values.externalValkey.existingSecret -}}
{{- $rest := regexReplaceAll "^[a-z+]+://([^@/]*@)?" $raw "" -}}
{{- printf "%s://%s:$(VALKEY_PASSWORD)@%s" $scheme ($userinfo | default "default") $rest -}}
{{- else -}}
{{- $raw -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Where the proxy finds the Valkey TLS files it was given. */}}
{{- define "sessionmem.valkey.tlsDir" -}}/etc/sessionmem/valkey-tls{{- end -}}
{{- define "sessionmem.valkey.clientTlsDir" -}}/etc/sessionmem/valkey-client-tls{{- end -}}

{{/*
The Secret with the CA the proxy verifies Valkey's certificate with ("" for the image's public CAs), and
the client certificate's Secret and keys ("" for none): from valkey.tls for the bundled Valkey, from
externalValkey.tls otherwise. A TLS setting without a TLS URL is an error, never a silent plain connection.
*/}}
{{- define "sessionmem.valkey.caSecret" -}}
{{- if .Values.valkey.enabled -}}
{{- if .Values.valkey.tls.enabled -}}
{{- required "valkey.tls.existingSecret is required when valkey.tls.enabled is true" .Values.valkey.tls.existingSecret -}}
{{- end -}}
{{- else -}}
{{- .Values.externalValkey.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "sessionmem.valkey.tlsQuery" -}}
{{- $ca := include "sessionmem.valkey.caSecret" . -}}
{{- $query := list -}}
{{- if $ca -}}
{{- $caKey := ternary "ca.crt" .Values.externalValkey.tls.caKey .Values.valkey.enabled -}}
{{- $query = append $query (printf "ssl_ca_certs=%s/%s" (include "sessionmem.valkey.tlsDir" .) $caKey) -}}
{{- end -}}
{{- if .Values.valkey.enabled -}}
{{- if and .Values.valkey.tls.enabled .Values.valkey.tls.clientExistingSecret -}}
{{- $dir := include "sessionmem.valkey.clientTlsDir" . -}}
{{- $query = append $query (printf "ssl_certfile=%s/tls.crt&ssl_keyfile=%s/tls.key" $dir $dir) -}}
{{- end -}}
{{- else -}}
{{- $tls := .Values.externalValkey.tls -}}
{{- if or $tls.existingSecret $tls.certKey $tls.keyKey -}}
{{- if not (regexMatch "^(valkeys|rediss)(\\+cluster)?://" .Values.externalValkey.url) -}}
{{- fail "externalValkey.tls needs a valkeys:// or rediss:// url: the proxy never sends conversations in plain text where TLS was asked for" -}}
{{- end -}}
{{- end -}}
{{- if or $tls.certKey $tls.keyKey -}}
{{- if not (and $tls.existingSecret $tls.certKey $tls.keyKey) -}}
{{- fail "externalValkey.tls: a client certificate needs existingSecret, certKey and keyKey" -}}
{{- end -}}
{{- $dir := include "sessionmem.valkey.tlsDir" . -}}
{{- $query = append $query (printf "ssl_certfile=%s/%s&ssl_keyfile=%s/%s" $dir $tls.certKey $dir $tls.keyKey) -}}
{{- end -}}
{{- end -}}
{{- if $query -}}?{{ join "&" $query }}{{- end -}}
{{- end -}}

{{/* TCP ports of the Valkey the proxy talks to, one per line (for its egress NetworkPolicy); a cluster URL
lists several seed nodes. */}}
{{- define "sessionmem.valkey.ports" -}}
{{- if .Values.valkey.enabled -}}
6379
{{- else -}}
{{- $hosts := regexReplaceAll "/.*$" (regexReplaceAll "^[a-z+]+://([^@/]*@)?" .Values.externalValkey.url "") "" -}}
{{- $ports := list -}}
{{- range $host := splitList "," $hosts -}}
{{- if regexMatch ":[0-9]+$" $host -}}
{{- $ports = append $ports (regexFind "[0-9]+$" $host) -}}
{{- else -}}
{{- $ports = append $ports "6379" -}}
{{- end -}}
{{- end -}}
{{- $ports | uniq | join "\n" -}}
{{- end -}}
{{- end -}}

{{/* Security contexts ------------------------------------------------------------------------------ */}}

{{/*
Security contexts. The defaults below are merged with a component's podSecurityContext and
containerSecurityContext values (a key set to null there removes the default). Under OpenShift's
restricted-v2 SCC fixed ids are refused: global.compatibility.openshift.adaptSecurityContext (auto: when
the cluster serves security.openshift.io/v1; force; disabled) leaves runAsUser, runAsGroup, fsGroup and
seLinuxOptions to the platform. The image runs under any uid (files world-readable, HOME=/tmp).
*/}}
{{- define "sessionmem.defaultPodSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "sessionmem.defaultContainerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "sessionmem.adaptsToOpenShift" -}}
{{- $mode := ((((.Values.global).compatibility).openshift).adaptSecurityContext) | default "auto" -}}
{{- if or (eq $mode "force") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "security.openshift.io/v1")) -}}
true
{{- end -}}
{{- end -}}

{{/* include "sessionmem.securityContext" (list $ defaultsYaml overrides) */}}
{{- define "sessionmem.securityContext" -}}
{{- $root := index . 0 -}}
{{- $context := fromYaml (index . 1) -}}
{{- range $key, $value := (index . 2 | default dict) -}}
{{- if kindIs "invalid" $value -}}
{{- $_ := unset $context $key -}}
{{- else -}}
{{- $_ := set $context $key $value -}}
{{- end -}}
{{- end -}}
{{- if include "sessionmem.adaptsToOpenShift" $root -}}
{{- range $key := list "runAsUser" "runAsGroup" "fsGroup" "seLinuxOptions" -}}
{{- $_ := unset $context $key -}}
{{- end -}}
{{- end -}}
{{- toYaml $context -}}
{{- end -}}

{{/* include "sessionmem.podSecurityContext" (list $ .Values.proxy 10001) */}}
{{- define "sessionmem.podSecurityContext" -}}
{{- $root := index . 0 -}}
{{- include "sessionmem.securityContext" (list $root (include "sessionmem.defaultPodSecurityContext" (index . 2)) (index . 1).podSecurityContext) -}}
{{- end -}}

{{/* include "sessionmem.containerSecurityContext" (list $ .Values.proxy) */}}
{{- define "sessionmem.containerSecurityContext" -}}
{{- $root := index . 0 -}}
{{- include "sessionmem.securityContext" (list $root (include "sessionmem.defaultContainerSecurityContext" .) (index . 1).containerSecurityContext) -}}
{{- end -}}

{{/* Scheduling fields shared by every pod spec: include "sessionmem.scheduling" .Values.proxy */}}
{{- define "sessionmem.scheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "sessionmem.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* NetworkPolicy ---------------------------------------------------------------------------------- */}}

{{/* Egress to the API server: the given CIDRs (or any address) on the API ports. */}}
{{- define "sessionmem.networkPolicy.apiServerEgress" -}}
- ports:
    {{- range .Values.networkPolicy.apiServer.ports }}
    - protocol: TCP
      port: {{ . }}
    {{- end }}
  {{- with .Values.networkPolicy.apiServer.cidrs }}
  to:
    {{- range . }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  {{- end }}
{{- end -}}

{{/*
A size in bytes (an integer) from a Valkey size (768mb, 2gb, 1000k: k/m/g powers of 1000, kb/mb/gb powers
of 1024, any case) or a Kubernetes memory quantity (512Mi, 1Gi, 1G); fails on anything else.
*/}}
{{- define "sessionmem.bytes" -}}
{{- $text := toString . | trim -}}
{{- $unit := regexFind "[A-Za-z]+$" $text -}}
{{- $number := trimSuffix $unit $text -}}
{{- $units := dict "" 1 "k" 1000 "kb" 1024 "m" 1000000 "mb" 1048576 "g" 1000000000 "gb" 1073741824 "t" 1000000000000 "tb" 1099511627776 "ki" 1024 "mi" 1048576 "gi" 1073741824 "ti" 1099511627776 -}}
{{- if or (not (regexMatch "^[0-9]+(\\.[0-9]+)?$" $number)) (not (hasKey $units (lower $unit))) -}}
{{- fail (printf "%q is not a size (e.g. 768mb, 2gb, 512Mi, 1Gi)" $text) -}}
{{- end -}}
{{- mulf (float64 $number) (get $units (lower $unit)) | int64 -}}
{{- end -}}

{{/*
The bundled Valkey's memory, checked: maxmemory below the container's memory limit (when one is set), and
at least capacity.agents agents at their default byte quota. Fail-closed: a chart that would let the agents
it admits fill Valkey past its container limit (OOM-killed before any agent sees a 507) is not rendered.
*/}}
{{- define "sessionmem.valkey.maxmemory" -}}
{{- $valkey := .Values.valkey -}}
{{- if not $valkey.maxmemory -}}
{{- fail "valkey.maxmemory must be set, below valkey.resources.limits.memory" -}}
{{- end -}}
{{- $max := include "sessionmem.bytes" $valkey.maxmemory | int64 -}}
{{- $limit := dig "resources" "limits" "memory" "" $valkey -}}
{{- if and $limit (ge $max (include "sessionmem.bytes" $limit | int64)) -}}
{{- fail (printf "valkey.maxmemory (%s) must be below the container's memory limit valkey.resources.limits.memory (%s): clients' buffers, Lua and the AOF rewrite need the rest" $valkey.maxmemory $limit) -}}
{{- end -}}
{{- $agents := int64 $valkey.capacity.agents -}}
{{- $quota := int64 .Values.proxy.quota.bytes -}}
{{- if gt (mul $agents $quota) $max -}}
{{- fail (printf "valkey.capacity.agents (%d) x proxy.quota.bytes (%d) is more than valkey.maxmemory (%s, %d bytes): lower the quota or the agents, or raise maxmemory and the container's limit" $agents $quota $valkey.maxmemory $max) -}}
{{- end -}}
{{- $valkey.maxmemory -}}
{{- end -}}
