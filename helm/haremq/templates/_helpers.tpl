{{/* Names and labels. */}}
{{- define "haremq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The StatefulSet's name; pods are FULLNAME-0 .. FULLNAME-(N-1), which `haremq node --peers-dns`
relies on (it takes the member names from --name minus the ordinal). Kept short enough for
"FULLNAME-headless" and the pod names to stay valid DNS labels.
*/}}
{{- define "haremq.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "haremq.headless" -}}
{{ include "haremq.fullname" . }}-headless
{{- end }}

{{/* The headless Service's DNS domain: pods are POD.<this>. */}}
{{- define "haremq.peerDomain" -}}
{{ include "haremq.headless" . }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
{{- end }}

{{- define "haremq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "haremq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "haremq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end }}

{{- define "haremq.commonLabels" -}}
helm.sh/chart: {{ include "haremq.chart" . }}
app.kubernetes.io/name: {{ include "haremq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: haremq
{{- end }}

{{- define "haremq.labels" -}}
{{ include "haremq.commonLabels" . }}
app.kubernetes.io/component: broker
{{- end }}

{{- define "haremq.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "haremq.secretName" -}}
{{- if .Values.auth.existingSecret }}
{{- .Values.auth.existingSecret }}
{{- else }}
{{- include "haremq.fullname" . }}-auth
{{- end }}
{{- end }}

{{- define "haremq.clusterTlsSecretName" -}}
{{- if .Values.clusterTls.existingSecret }}
{{- .Values.clusterTls.existingSecret }}
{{- else }}
{{- include "haremq.fullname" . }}-cluster-tls
{{- end }}
{{- end }}

{{/*
A Secret value, base64: the one given in values, else the one already in the cluster (so a
generated secret survives upgrades), else a new random one. Args: list given old-data key length.
*/}}
{{- define "haremq.secretValue" -}}
{{- $given := index . 0 }}
{{- $old := index . 1 }}
{{- $key := index . 2 }}
{{- $length := index . 3 }}
{{- if $given }}
{{- $given | toString | b64enc }}
{{- else if and $old (hasKey $old $key) }}
{{- index $old $key }}
{{- else }}
{{- randAlphaNum $length | b64enc }}
{{- end }}
{{- end }}

{{- define "haremq.affinity" -}}
{{- if .Values.affinity }}
{{- toYaml .Values.affinity }}
{{- else if eq .Values.podAntiAffinity "hard" }}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - labelSelector:
        matchLabels:
          {{- include "haremq.selectorLabels" . | nindent 10 }}
      topologyKey: kubernetes.io/hostname
{{- else if eq .Values.podAntiAffinity "soft" }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        labelSelector:
          matchLabels:
            {{- include "haremq.selectorLabels" . | nindent 12 }}
        topologyKey: kubernetes.io/hostname
{{- end }}
{{- end }}

{{/*
Seconds the preStop hook waits for a synchronised mirror elsewhere: the grace period less a
minute for the drain and the node's own shutdown (at least 10).
*/}}
{{- define "haremq.preStopTimeout" -}}
{{- max 10 (sub (int .Values.terminationGracePeriodSeconds) 60) -}}
{{- end }}
