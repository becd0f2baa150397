{{/*
Names are fixed (not derived from the release name): the operator's id `proxy-operator` names its
Lease and ConfigMaps, and the RBAC rules name those. One release per cluster: the CRDs and
ClusterRoles are cluster-wide anyway.
*/}}

{{/* Labels on every object: the kustomization's, and Helm's usual ones. */}}
{{- define "proxy-operator.labels" -}}
app.kubernetes.io/part-of: proxy-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The operator's image: repository@digest, or repository:tag; no tag: the release's,
v<appVersion> (what `make release` tags). */}}
{{- define "proxy-operator.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" (trimPrefix "v" .Chart.AppVersion)) }}
{{- end -}}
{{- end }}

{{/* The operator's replicas: replicaCount, or the old key `replicas` when a values file still
sets it (NOTES.txt says to rename it). */}}
{{- define "proxy-operator.replicas" -}}
{{- if and (hasKey .Values "replicas") (not (kindIs "invalid" .Values.replicas)) -}}
{{ .Values.replicas }}
{{- else -}}
{{ .Values.replicaCount }}
{{- end -}}
{{- end }}

{{/* The operator's ServiceAccount's name. */}}
{{- define "proxy-operator.serviceAccountName" -}}
{{ .Values.serviceAccount.name }}
{{- end }}

{{/* The distinct namespaces the providers' kube grants name. */}}
{{- define "proxy-operator.providerNamespaces" -}}
{{- $namespaces := list -}}
{{- range .Values.providers -}}
{{- if and .grants .grants.kube .grants.kube.namespace -}}
{{- $namespaces = append $namespaces .grants.kube.namespace -}}
{{- end -}}
{{- end -}}
{{- toJson (uniq $namespaces) -}}
{{- end }}

{{/* The ServiceAccount the operator runs as, as a subject. */}}
{{- define "proxy-operator.subject" -}}
- kind: ServiceAccount
  name: {{ include "proxy-operator.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}
