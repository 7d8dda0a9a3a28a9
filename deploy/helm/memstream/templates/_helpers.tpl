{{/* The chart's name, cut to Kubernetes' 63 characters. */}}
{{- define "memstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's resource names: <release>-memstream unless the release says it. */}}
{{- define "memstream.fullname" -}}
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

{{- define "memstream.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The headless Service: gives each worker pod its stable DNS name. */}}
{{- define "memstream.headless" -}}
{{- printf "%s-headless" (include "memstream.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "memstream.labels" -}}
helm.sh/chart: {{ include "memstream.chart" . }}
{{ include "memstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: memstream
{{- end }}

{{- define "memstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "memstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "memstream.qdrant.selectorLabels" -}}
app.kubernetes.io/name: {{ include "memstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: qdrant
{{- end }}

{{- define "memstream.qdrant.labels" -}}
helm.sh/chart: {{ include "memstream.chart" . }}
{{ include "memstream.qdrant.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.qdrant.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: memstream
{{- end }}

{{- define "memstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "memstream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret with the keys: the one given, or the chart's own (<fullname>-keys: not
the name of the worker's Strimzi KafkaUser, whose Secret is named after it). */}}
{{- define "memstream.secretName" -}}
{{- default (printf "%s-keys" (include "memstream.fullname" . | trunc 58 | trimSuffix "-")) .Values.secrets.existingSecret }}
{{- end }}

{{- define "memstream.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* http or https: the API's scheme (probes, advertised URLs, the ServiceMonitor). */}}
{{- define "memstream.scheme" -}}
{{- if .Values.web.tls.secretName }}https{{ else }}http{{ end }}
{{- end }}

{{/* The Qdrant server the workers use: the release's own or an external one ("": none). */}}
{{- define "memstream.qdrantUrl" -}}
{{- if .Values.qdrant.enabled }}
{{- printf "http://%s-qdrant:6333" (include "memstream.fullname" .) }}
{{- else }}
{{- .Values.qdrant.url }}
{{- end }}
{{- end }}

{{/* The Kafka settings' consistency, refused at render time (the worker would exit 78). */}}
{{- define "memstream.validate" -}}
{{- $k := .Values.kafka }}
{{- if and (hasPrefix "SASL" $k.securityProtocol) (not (and $k.sasl.username $k.sasl.passwordSecret.name)) }}
{{- fail (printf "kafka.securityProtocol %s needs kafka.sasl.username and kafka.sasl.passwordSecret.name" $k.securityProtocol) }}
{{- end }}
{{- if and $k.tls.clientSecret.name (not (has $k.securityProtocol (list "SSL" "SASL_SSL"))) }}
{{- fail "kafka.tls.clientSecret (mutual TLS) needs kafka.securityProtocol SSL or SASL_SSL" }}
{{- end }}
{{- if and (eq .Values.topics.inputTopics "per-tenant") (empty .Values.topics.tenants) }}
{{- fail "topics.inputTopics per-tenant needs topics.tenants" }}
{{- end }}
{{- if gt (int .Values.replicaCount) (int .Values.topics.partitions) }}
{{- fail "replicaCount is above topics.partitions: the workers beyond the partitions would get none" }}
{{- end }}
{{- if and .Values.qdrant.enabled .Values.qdrant.url }}
{{- fail "qdrant.enabled and qdrant.url: choose the release's Qdrant server or an external one" }}
{{- end }}
{{- end }}
