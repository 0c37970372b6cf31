{{/* Names and labels shared by every object of the release. */}}

{{- define "textgen.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "textgen.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "textgen.selectorLabels" -}}
app.kubernetes.io/name: {{ include "textgen.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "textgen.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "textgen.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "textgen.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The Secret holding HF_TOKEN: the user's, or the one this chart creates. Empty: none. */}}
{{- define "textgen.hfTokenSecret" -}}
{{- if .Values.hfToken.existingSecret }}
{{- .Values.hfToken.existingSecret }}
{{- else if .Values.hfToken.value }}
{{- printf "%s-hf-token" (include "textgen.fullname" .) }}
{{- end }}
{{- end }}

{{- define "textgen.cacheClaim" -}}
{{- .Values.cache.existingClaim | default (printf "%s-cache" (include "textgen.fullname" .)) }}
{{- end }}

{{/*
Seconds Kubernetes waits between the preStop hook and SIGKILL. It must cover the preStop
sleep, the router's drain and the shards' exit, or in-flight requests are cut off.
*/}}
{{- define "textgen.terminationGracePeriod" -}}
{{- $floor := add .Values.preStopSleepSeconds .Values.drainTimeoutSeconds }}
{{- if .Values.terminationGracePeriodSeconds }}
{{- if le (int .Values.terminationGracePeriodSeconds) (int $floor) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed preStopSleepSeconds + drainTimeoutSeconds (%v)" .Values.terminationGracePeriodSeconds $floor) }}
{{- end }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- else }}
{{- add $floor 25 }}
{{- end }}
{{- end }}
