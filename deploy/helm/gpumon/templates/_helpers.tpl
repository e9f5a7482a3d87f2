{{- define "gpumon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpumon.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; call with (dict "ctx" $ "component" "exporter"). */}}
{{- define "gpumon.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{ include "gpumon.selectorLabels" . }}
{{- end -}}

{{- define "gpumon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpumon.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpumon.image" -}}
{{- printf "%s:%s" .repository (default $.appVersion .tag) -}}
{{- end -}}

{{- define "gpumon.exporter.name" -}}{{ include "gpumon.fullname" . }}-exporter{{- end -}}
{{- define "gpumon.controller.name" -}}{{ include "gpumon.fullname" . }}-controller{{- end -}}

{{/* GPU nodes only (any of the labels), tolerating their taints; call with .Values.exporter. */}}
{{- define "gpumon.exporter.placement" -}}
{{- if .gpuNodeLabels -}}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        {{- range .gpuNodeLabels }}
        - matchExpressions:
            - {key: {{ . | quote }}, operator: Exists}
        {{- end }}
{{- end }}
{{- with .tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The TLS Secret's name; empty with TLS off. */}}
{{- define "gpumon.tls.secret" -}}
{{- if .Values.tls.enabled -}}
{{- if .Values.tls.certManager.enabled -}}
{{ include "gpumon.fullname" . }}-tls
{{- else -}}
{{ required "tls.secretName: name a kubernetes.io/tls Secret, or set tls.certManager.enabled" .Values.tls.secretName }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name each Service's certificate is checked against; call with (dict "ctx" $ "service" name). */}}
{{- define "gpumon.tls.serverName" -}}{{ .service }}.{{ .ctx.Release.Namespace }}.svc{{- end -}}

{{- define "gpumon.auth.secret" -}}
{{ required (printf "auth.secretName: name the Secret holding the %s credentials" .Values.auth.mode) .Values.auth.secretName }}
{{- end -}}

{{/* The server settings both programs share (tls, auth), as config keys; fromYaml it. */}}
{{- define "gpumon.server.config" -}}
{{- $a := .Values.auth -}}
{{- if .Values.tls.enabled }}
tls:
  cert_file: /var/run/gpumon/tls/tls.crt
  key_file: /var/run/gpumon/tls/tls.key
{{- end }}
{{- if eq $a.mode "bearer" }}
auth:
  bearer_token_file: /var/run/gpumon/auth/token
{{- else if eq $a.mode "kubernetes" }}
auth:
  mode: kubernetes
  kubernetes:
    cache_ttl_seconds: {{ $a.kubernetes.cacheTTLSeconds }}
{{- end }}
{{- end -}}

{{/* A program's server limits (exporter.server or controller.server) as its config section. */}}
{{- define "gpumon.server.limits" -}}
server:
  header_timeout_seconds: {{ .headerTimeoutSeconds }}
  idle_timeout_seconds: {{ .idleTimeoutSeconds }}
  max_connections: {{ .maxConnections }}
{{- end -}}

{{/* Environment for the server settings: basic credentials never go in a ConfigMap. */}}
{{- define "gpumon.server.env" -}}
{{- if eq .Values.auth.mode "basic" }}
- name: GPUMON_AUTH__BASIC_USERNAME
  valueFrom: {secretKeyRef: {name: {{ include "gpumon.auth.secret" . }}, key: username}}
- name: GPUMON_AUTH__BASIC_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "gpumon.auth.secret" . }}, key: password}}
{{- end }}
{{- end -}}

{{- define "gpumon.server.volumeMounts" -}}
{{- if .Values.tls.enabled }}
- {name: tls, mountPath: /var/run/gpumon/tls, readOnly: true}
{{- end }}
{{- if eq .Values.auth.mode "bearer" }}
- {name: auth, mountPath: /var/run/gpumon/auth, readOnly: true}
{{- end }}
{{- end -}}

{{/* Secret files are readable by their owner and the pod's fsGroup only. */}}
{{- define "gpumon.server.volumes" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret: {secretName: {{ include "gpumon.tls.secret" . }}, defaultMode: 0440}
{{- end }}
{{- if eq .Values.auth.mode "bearer" }}
- name: auth
  secret: {secretName: {{ include "gpumon.auth.secret" . }}, defaultMode: 0440, items: [{key: token, path: token}]}
{{- end }}
{{- end -}}

{{/* The probes of a server: open paths, HTTPS with TLS on. */}}
{{- define "gpumon.server.probes" -}}
{{- $scheme := ternary "HTTPS" "HTTP" .Values.tls.enabled -}}
livenessProbe:
  httpGet: {path: /healthz, port: metrics, scheme: {{ $scheme }}}
  periodSeconds: 10
  failureThreshold: 6
readinessProbe:
  httpGet: {path: /readyz, port: metrics, scheme: {{ $scheme }}}
  periodSeconds: 5
{{- end -}}

{{/* Binds a release ServiceAccount to system:auth-delegator (TokenReview, SubjectAccessReview);
call with (dict "ctx" $ "name" account "component" component). */}}
{{- define "gpumon.authDelegator" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .name }}-auth-delegator
  labels: {{- include "gpumon.labels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ .ctx.Release.Namespace }}
{{- end -}}
