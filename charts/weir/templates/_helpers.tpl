{{/* The chart's name, or nameOverride. */}}
{{- define "weir.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: "weir" for a release named weir (or any name containing it). */}}
{{- define "weir.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object: the selector labels, and the chart (label values may not hold
     "+", which a SemVer build suffix has) and the tool that manages the release. Never in a
     selector or the pod template: a selector cannot change after the DaemonSet is made, and a
     new chart version alone should not restart every agent. */}}
{{- define "weir.labels" -}}
helm.sh/chart: {{ include "weir.chart" . }}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "weir.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The agent's image: repository@digest when a digest is given (the tag is then ignored: the
     digest alone names the image), else repository:tag, the tag defaulting to appVersion. */}}
{{- define "weir.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "weir.serviceAccountName" -}}
{{- default (include "weir.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The user name of the agent's service account, as admission sees it. */}}
{{- define "weir.serviceAccountUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "weir.serviceAccountName" . }}
{{- end }}

{{/* Kubernetes 1.30 or later: ValidatingAdmissionPolicy is GA, pod-bound tokens name their
     node, and a container's securityContext has appArmorProfile. */}}
{{- define "weir.atLeast130" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}true{{ end }}
{{- end }}

{{- define "weir.admissionPolicies" -}}
{{- if and .Values.admissionPolicies.enabled (include "weir.atLeast130" .) }}true{{ end }}
{{- end }}

{{/* The agent's --metrics-addr. By default the node's IP from the downward API, bracketed so
     that an IPv6 address parses too (the agent reads [HOST]:PORT for either family). */}}
{{- define "weir.metricsAddr" -}}
{{- $host := .Values.metrics.host }}
{{- if eq $host "" }}
{{- printf "[$(HOST_IP)]:%d" (int .Values.metrics.port) }}
{{- else if contains ":" $host }}
{{- printf "[%s]:%d" $host (int .Values.metrics.port) }}
{{- else }}
{{- printf "%s:%d" $host (int .Values.metrics.port) }}
{{- end }}
{{- end }}

{{/* The controller: its name, its selector labels, its account. Its pods carry a name label
     of their own: the DaemonSet's selector (name and instance, immutable) must not match them. */}}
{{- define "weir.controllerName" -}}
{{- printf "%s-controller" (include "weir.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "weir.controllerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}-controller
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "weir.controllerServiceAccountName" -}}
{{- default (include "weir.controllerName" .) .Values.controller.serviceAccount.name }}
{{- end }}

{{- define "weir.controllerServiceAccountUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "weir.controllerServiceAccountName" . }}
{{- end }}
