{{/* Chart name. */}}
{{- define "rtj-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "rtj-operator.fullname" -}}
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

{{/* Chart label. */}}
{{- define "rtj-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "rtj-operator.labels" -}}
helm.sh/chart: {{ include "rtj-operator.chart" . }}
{{ include "rtj-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels. */}}
{{- define "rtj-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rtj-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* ServiceAccount name. */}}
{{- define "rtj-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rtj-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
What the operator does in the namespaces it watches; every verb is one the operator uses
(tests/test_chart.py checks these rules against the API calls of a full scenario).
*/}}
{{- define "rtj-operator.namespacedRules" -}}
- apiGroups: ["training.rtj.dev"]
  resources: ["resilienttrainingjobs"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["training.rtj.dev"]
  resources: ["resilienttrainingjobs/status"]
  verbs: ["get", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
# A pod on a node lost past the grace period is evicted (DisruptionTarget, not charged to the Job's
# backoffLimit); one then stuck Terminating there is marked Failed before it is deleted, as PodGC does.
- apiGroups: [""]
  resources: ["pods/eviction"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "create", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* Cluster-scoped reads: node health decides the recovery tier. */}}
{{- define "rtj-operator.clusterRules" -}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
{{- end }}
