{{/* The chart's name, or nameOverride. */}}
{{- define "hpp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart> (just the release when it already contains the chart's name), or fullnameOverride. */}}
{{- define "hpp.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "hpp.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod selector: fixed for the life of a release (a DaemonSet's selector cannot change). */}}
{{- define "hpp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hpp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The recommended labels, on every object. */}}
{{- define "hpp.labels" -}}
{{ include "hpp.selectorLabels" . }}
app.kubernetes.io/version: {{ include "hpp.versionLabel" . | quote }}
app.kubernetes.io/part-of: hostpath-provisioner
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "hpp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hpp.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* registry/repository:tag or registry/repository@digest. */}}
{{- define "hpp.image" -}}
{{- $repository := .Values.image.repository }}
{{- with .Values.image.registry }}{{ $repository = printf "%s/%s" . $repository }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The image tag as a label value: at most 63 characters, starting and ending with a letter or
     digit (a tag may be 128 characters long and end in `_` or `.`). */}}
{{- define "hpp.versionLabel" -}}
{{- regexReplaceAll "^[^A-Za-z0-9]+|[^A-Za-z0-9]+$" (.Values.image.tag | default .Chart.AppVersion | toString | trunc 63) "" }}
{{- end }}

{{/* The volume of a pool: `pv-volume` for legacy (the Go build's name), pool-<name> for the
     others. A volume name is a DNS label of at most 63 characters, and a pool name may have 63
     itself (the binary, the classes' storagePool and the operator accept that): a name longer
     than 58 keeps its first 49 characters and gets 8 of its SHA-256 instead, which keeps the
     names of two pools apart. Nothing outside the pod spec refers to these names. */}}
{{- define "hpp.poolVolume" -}}
{{- if eq .name "legacy" }}pv-volume
{{- else if le (len .name) 58 }}pool-{{ .name }}
{{- else }}pool-{{ .name | trunc 49 }}-{{ sha256sum .name | trunc 8 }}
{{- end }}
{{- end }}

{{/* STORAGE_POOLS (of a list of pools): every pool but legacy, as NAME=PATH[,shared][,reserve=SIZE][,accounting=MODE], comma-separated. */}}
{{- define "hpp.storagePools" -}}
{{- $entries := list }}
{{- range . }}
{{- if ne .name "legacy" }}
{{- $entry := printf "%s=%s" .name .path }}
{{- if .shared }}{{ $entry = printf "%s,shared" $entry }}{{ end }}
{{- if .reserve }}{{ $entry = printf "%s,reserve=%s" $entry (toString .reserve) }}{{ end }}
{{- if .accounting }}{{ $entry = printf "%s,accounting=%s" $entry .accounting }}{{ end }}
{{- if .requireMountpoint }}{{ $entry = printf "%s,mountpoint" $entry }}{{ end }}
{{- $entries = append $entries $entry }}
{{- else if .requireMountpoint }}
{{- fail "pools: the legacy pool takes config.requireMountpoint, not requireMountpoint" }}
{{- end }}
{{- end }}
{{- join "," $entries }}
{{- end }}

{{/* The legacy pool of a list of pools, or an empty dict. */}}
{{- define "hpp.legacyPool" -}}
{{- range . }}{{ if eq .name "legacy" }}{{ toYaml . }}{{ end }}{{ end }}
{{- end }}

{{/* The peers Service's name (templates/peers-service.yaml), within the 63 characters of a name. */}}
{{- define "hpp.peersService" -}}
{{ include "hpp.fullname" . | trunc 57 | trimSuffix "-" }}-peers
{{- end }}

{{/* The metrics Service's name (templates/metrics-service.yaml), within the 63 characters of a name. */}}
{{- define "hpp.metricsService" -}}
{{ include "hpp.fullname" . | trunc 55 | trimSuffix "-" }}-metrics
{{- end }}

{{/* The node groups the DaemonSet template renders, as JSON {"groups": [...]}: nodeGroups, or
     one unnamed group with `pools` on every node. */}}
{{- define "hpp.groups" -}}
{{- if .Values.nodeGroups }}
{{- dict "groups" .Values.nodeGroups | toJson }}
{{- else }}
{{- dict "groups" (list (dict "name" "" "nodeSelector" dict "pools" .Values.pools)) | toJson }}
{{- end }}
{{- end }}

{{/* The test pod's name label: not the provisioner pods' (see templates/tests/volume.yaml), within
     the 63 characters of a label value. */}}
{{- define "hpp.testName" -}}
{{ include "hpp.name" . | trunc 58 | trimSuffix "-" }}-test
{{- end }}
