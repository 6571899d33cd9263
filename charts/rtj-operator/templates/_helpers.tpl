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
(tests/cluster/test_chart.py checks these rules against the API calls of a full scenario). Each rule's
comment says why: docs/security.md's table shows them (hack/docs_tables.py).
*/}}
{{- define "rtj-operator.namespacedRules" -}}
# The watch; patch only to remove the finalizer earlier versions put on RTJs.
- apiGroups: ["training.rtj.dev"]
  resources: ["resilienttrainingjobs"]
  verbs: ["get", "list", "watch", "patch"]
# One status write per pass (a merge patch: the status is never read back through this subresource).
- apiGroups: ["training.rtj.dev"]
  resources: ["resilienttrainingjobs/status"]
  verbs: ["patch"]
# The children's owner references block their owner's deletion (blockOwnerDeletion, as kopf.adopt sets
# it: `kubectl delete rtj --cascade=foreground` waits until the gang's Job, pods, Service and PVC are
# gone), which the OwnerReferencesPermissionEnforcement admission plugin allows only to who may update
# the owner's finalizers. A custom resource serves no finalizers subresource: this grant is only that check.
- apiGroups: ["training.rtj.dev"]
  resources: ["resilienttrainingjobs/finalizers"]
  verbs: ["update"]
# The gang, one Job per attempt (patch: suspend and resume; delete: a gang restart).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The watch. create: the gang's coordinator pod (the rendezvous and the ranks' stores). patch: a new
# worker pod's scheduling gate is removed (and the job's excluded nodes added to its node affinity)
# before it is placed. delete: a pod on a fenced node (below), the coordinator when its gang stops.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# A pod on a node lost past the grace period is evicted (UID precondition; DisruptionTarget: the Job's
# pod failure policy ignores it).
- apiGroups: [""]
  resources: ["pods/eviction"]
  verbs: ["create"]
# A pod then stuck Terminating on a lost node is, once the node is fenced (Node deleted, out-of-service
# taint, or its EC2 instance stopped with fencing.ec2), marked Failed with a DisruptionTarget condition
# (UID-guarded) before it is deleted, as PodGC does: a pod deleted while not terminal counts as a
# failure of its index; one marked Failed as a disruption does not. Needed without fencing.ec2 too (a
# deleted Node, the taint), so no value gates it; RBAC cannot narrow it to the operator's own pods.
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# The gang's Service, a child of the RTJ: watched (its own labels select it) so that passes read no object;
# get: after a create finds the name taken; patch: its spec drifted. Never deleted: the garbage collector
# removes it with the RTJ (owner reference).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The shared checkpoint volume (spec.storage with a StorageClass), a child of the RTJ, watched likewise.
# Never deleted by the operator: with retention Delete the garbage collector removes it with the RTJ
# (owner reference); with Retain it has no owner and stays.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create"]
# The gang's NetworkPolicy (spec.isolation), a child of the RTJ, watched by its labels: only the job's own
# pods may reach its rendezvous and stores. patch: its spec drifted or spec.isolation.allowFrom changed;
# delete: the user turned spec.isolation off (only the RTJ's own, by uid).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The gang's Service's endpoints, listed (by the Service's name label) only while a new gang's pods wait
# for their coordinator: a worker resolves the coordinator's name first, and cluster DNS serves it from
# these, published a while after the coordinator has an address. Without the grant, the pods wait for
# the address alone.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list"]
# What `kubectl describe rtj` shows.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Kueue (only for RTJs with a queue): the Workload of the gang's Job is listed by its job-uid label
# (admission, eviction) and deactivated for spec.suspend or a failed job (Kueue's own way to stop a gang
# it admitted).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "patch"]
{{- end }}

{{- define "rtj-operator.clusterRules" -}}
# Cluster-scoped reads: node health decides the recovery tier.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
{{- if .Values.metrics.secure }}
# Each metrics scrape (metrics.secure): its bearer token reviewed (who is it?) ...
- apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
# ... then that user's access to get /metrics (may it scrape?).
- apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
{{- end }}
{{- end }}

{{/*
The capacity probes' PriorityClass (values.capacityProbes): its name, empty when there is none.
*/}}
{{- define "rtj-operator.probePriorityClass" -}}
{{- if .Values.capacityProbes.priorityClass.name -}}
{{- .Values.capacityProbes.priorityClass.name -}}
{{- else if .Values.capacityProbes.priorityClass.create -}}
{{- printf "%s-capacity-probe" (include "rtj-operator.fullname" .) | trunc 253 -}}
{{- end -}}
{{- end }}
