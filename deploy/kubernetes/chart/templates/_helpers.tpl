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

{{/* Selector labels of a front end's pods (dict "ctx" $ "name" "xpu-device-plugin"): not the daemon's, so the
Service, the ServiceMonitor and each DaemonSet select only their own pods. */}}
{{- define "xrk.frontEndSelectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end -}}

{{- define "xrk.frontEndLabels" -}}
{{ include "xrk.frontEndSelectorLabels" . }}
app.kubernetes.io/part-of: xpu-runtime-kit
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version }}
{{- end -}}

{{/* The pod affinity of a front end (dict "ctx" $ "frontEnd" "dra"): the values' affinity with one more
requirement in each of its required node selector terms (terms are ORed, a term's expressions ANDed), so a node
runs this front end only when frontEnd picks it. The two front ends' requirements are complements (In / NotIn
one label value), so no node matches both. */}}
{{- define "xrk.frontEndAffinity" -}}
{{- $values := .ctx.Values -}}
{{- $default := $values.frontEnd.default -}}
{{- if not (has $default (list "device-plugin" "dra")) -}}
{{- fail (printf "frontEnd.default must be device-plugin or dra, not %q" $default) -}}
{{- end -}}
{{- $other := ternary "dra" "device-plugin" (eq $default "device-plugin") -}}
{{- $requirement := dict "key" $values.frontEnd.nodeLabel "values" (list $other) -}}
{{- if eq .frontEnd $default -}}
{{- $_ := set $requirement "operator" "NotIn" -}}
{{- else -}}
{{- $_ := set $requirement "operator" "In" -}}
{{- end -}}
{{- $affinity := deepCopy ($values.affinity | default dict) -}}
{{- $node := $affinity.nodeAffinity | default dict -}}
{{- $required := $node.requiredDuringSchedulingIgnoredDuringExecution | default dict -}}
{{- $terms := list -}}
{{- range ($required.nodeSelectorTerms | default (list dict)) -}}
{{- $terms = append $terms (merge (dict "matchExpressions" (append (.matchExpressions | default list) $requirement)) .) -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- toYaml $affinity -}}
{{- end -}}

{{- define "xrk.draServiceAccountName" -}}
{{- default (printf "%s-dra-driver" (include "xrk.fullname" .) | trunc 63 | trimSuffix "-") .Values.draDriver.serviceAccountName -}}
{{- end -}}

{{/* Pod settings the front ends share with the daemon's pod (dict "ctx" $ "frontEnd" "dra"): the same nodes
(nodeSelector, tolerations, priority), narrowed by xrk.frontEndAffinity. */}}
{{- define "xrk.frontEndPodSettings" -}}
{{- with .ctx.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .ctx.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .ctx.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
  {{- include "xrk.frontEndAffinity" . | nindent 2 }}
securityContext:
  seccompProfile:
    type: RuntimeDefault
{{- end -}}
