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

{{- define "sessionmem.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "sessionmem.launcherImage" -}}
{{- .Values.operator.launcher.image | default (include "sessionmem.image" .) -}}
{{- end -}}

{{- define "sessionmem.valkey.image" -}}
{{- if .Values.valkey.image.digest -}}
{{- printf "%s@%s" .Values.valkey.image.repository .Values.valkey.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.valkey.image.repository .Values.valkey.image.tag -}}
{{- end -}}
{{- end -}}

{{/* URLs ------------------------------------------------------------------------------------------- */}}

{{- define "sessionmem.proxy.host" -}}
{{- printf "%s.%s.svc.%s" (include "sessionmem.proxy.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* The proxy URL the operator hands to agent pods: unset (null) means this release's proxy Service; an
explicit "" means none, and the operator then reports MemoryReady=False (NoProxyConfigured) on every agent. */}}
{{- define "sessionmem.proxy.url" -}}
{{- if kindIs "invalid" .Values.operator.proxyUrl -}}
{{- printf "http://%s:%d" (include "sessionmem.proxy.host" .) (int .Values.proxy.port) -}}
{{- else -}}
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
{{- if .Values.valkey.enabled -}}
{{- printf "valkey://%s:$(VALKEY_PASSWORD)@%s.%s.svc.%s:6379/0" .Values.valkey.username (include "sessionmem.valkey.fullname" .) .Release.Namespace .Values.clusterDomain -}}
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

{{- define "sessionmem.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "sessionmem.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
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
