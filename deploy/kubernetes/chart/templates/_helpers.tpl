{{/* Names and labels shared by every object. */}}
{{- define "xrk.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "xrk.selectorLabels" -}}
app.kubernetes.io/name: xpu-healthd
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "xrk.labels" -}}
{{ include "xrk.selectorLabels" . }}
app.kubernetes.io/part-of: xpu-runtime-kit
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "xrk.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "xrk.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "xrk.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
