{{/* Chart name, truncated to 63 characters. */}}
{{- define "cce-ipam.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart> unless the release name already contains the chart name. */}}
{{- define "cce-ipam.fullname" -}}
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

{{- define "cce-ipam.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cce-ipam.labels" -}}
helm.sh/chart: {{ include "cce-ipam.chart" . }}
{{ include "cce-ipam.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cce-ipam.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cce-ipam.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of the helm test hook's objects: not the replicas' selector labels (another name), so that the
     Services, the PodDisruptionBudget and the Deployment never count the hook pod as a replica. */}}
{{- define "cce-ipam.testLabels" -}}
helm.sh/chart: {{ include "cce-ipam.chart" . }}
app.kubernetes.io/name: {{ printf "%s-ring-check" (include "cce-ipam.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cce-ipam.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cce-ipam.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Headless Service of the replicas: memberlist join DNS and metrics. */}}
{{- define "cce-ipam.peersService" -}}
{{- printf "%s-peers" (include "cce-ipam.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cce-ipam.bceSecretName" -}}
{{- default (printf "%s-bce" (include "cce-ipam.fullname" .)) .Values.bce.credentials.existingSecret }}
{{- end }}

{{/* The Secret of the gossip and forward keys that the replicas create themselves (none is rendered:
     `helm template` renders no random value). Unused with memberlist.gossipKey.existingSecret. */}}
{{- define "cce-ipam.keySecretName" -}}
{{- printf "%s-keys" (include "cce-ipam.fullname" .) }}
{{- end }}

{{/* repository@digest when a digest is set (the tag is then ignored: a reference with both is
     resolved by digest anyway, and some runtimes refuse it), else repository:tag. */}}
{{- define "cce-ipam.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* app.kubernetes.io/version of the pods: the version that runs (the image tag, default the appVersion),
     as a label value (at most 63 characters, alphanumeric at both ends). */}}
{{- define "cce-ipam.podVersion" -}}
{{- default .Chart.AppVersion .Values.image.tag | trunc 63 | trimSuffix "-" | trimSuffix "." | trimSuffix "_" }}
{{- end }}

{{/* host:port for a listener: listenAddress (empty = every interface) and a port. */}}
{{- define "cce-ipam.listen" -}}
{{- $host := .root.Values.listenAddress }}
{{- if contains ":" $host }}
{{- printf "[%s]:%v" $host .port }}
{{- else }}
{{- printf "%s:%v" $host .port }}
{{- end }}
{{- end }}

{{/*
One alerting rule of templates/prometheusrule-alerts.yaml: dict with root
(the chart's context), name, cfg (its alerts.<rule> values: for, severity),
expr, summary and description; runbook_url points at the alert's section of
the chart README.
*/}}
{{- define "cce-ipam.alert" -}}
- alert: {{ .name }}
  expr: {{ .expr | quote }}
  for: {{ .cfg.for }}
  labels:
    severity: {{ .cfg.severity | quote }}
    {{- with .root.Values.alerts.alertLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    summary: {{ .summary | quote }}
    description: {{ .description | quote }}
    runbook_url: {{ printf "%s#%s" .root.Values.alerts.runbookBaseURL (lower .name) | quote }}
{{- end }}
