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
