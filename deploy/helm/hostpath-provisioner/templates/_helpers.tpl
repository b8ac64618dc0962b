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

{{/* The volume of a pool root (of a dict: `pool`, and the group's `pools`): `pv-volume` for
     legacy's first root (PV_DIR, the Go build's name), pool-<name> for the others. A volume name is a DNS label of at
     most 63 characters, and a pool name may have 63 itself (the binary, the classes' storagePool
     and the operator accept that): a name longer than 58 keeps its first 49 characters and gets
     8 of its SHA-256 instead, which keeps the names of two pools apart. A pool of several roots
     (its name listed once per disk) gets 8 of the SHA-256 of each root's path the same way.
     Nothing outside the pod spec refers to these names. */}}
{{- define "hpp.poolVolume" -}}
{{- $pool := .pool }}
{{- $roots := 0 }}
{{- range .pools }}{{ if eq .name $pool.name }}{{ $roots = add1 $roots }}{{ end }}{{ end }}
{{- $first := dict }}
{{- range .pools }}{{ if and (eq .name $pool.name) (not $first) }}{{ $first = . }}{{ end }}{{ end }}
{{- if and (eq $pool.name "legacy") (eq $first.path $pool.path) }}pv-volume
{{- else if gt $roots 1 }}pool-{{ $pool.name | trunc 49 }}-{{ sha256sum (toString $pool.path) | trunc 8 }}
{{- else if le (len $pool.name) 58 }}pool-{{ $pool.name }}
{{- else }}pool-{{ $pool.name | trunc 49 }}-{{ sha256sum $pool.name | trunc 8 }}
{{- end }}
{{- end }}

{{/* STORAGE_POOLS (of a list of pools): every pool root but the first legacy one (PV_DIR), as
     NAME=PATH[,shared][,reserve=SIZE][,accounting=MODE][,mountpoint], comma-separated; a pool of
     several roots (its name listed once per disk) has an entry per root. */}}
{{- define "hpp.storagePools" -}}
{{- $entries := list }}
{{- $legacySeen := false }}
{{- range . }}
{{- if and (eq .name "legacy") (not $legacySeen) }}
{{- $legacySeen = true }}
{{- if .requireMountpoint }}{{ fail "pools: the legacy pool takes config.requireMountpoint, not requireMountpoint" }}{{ end }}
{{- else }}
{{- $entry := printf "%s=%s" .name .path }}
{{- if .shared }}{{ $entry = printf "%s,shared" $entry }}{{ end }}
{{- if .reserve }}{{ $entry = printf "%s,reserve=%s" $entry (toString .reserve) }}{{ end }}
{{- if .accounting }}{{ $entry = printf "%s,accounting=%s" $entry .accounting }}{{ end }}
{{- if .requireMountpoint }}{{ $entry = printf "%s,mountpoint" $entry }}{{ end }}
{{- $entries = append $entries $entry }}
{{- end }}
{{- end }}
{{- join "," $entries }}
{{- end }}

{{/* The legacy pool of a list of pools (its first legacy root: PV_DIR), or an empty dict. */}}
{{- define "hpp.legacyPool" -}}
{{- $found := false }}
{{- range . }}{{ if and (eq .name "legacy") (not $found) }}{{ $found = true }}{{ toYaml . }}{{ end }}{{ end }}
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

{{/* Where the `otherNodes` group runs, as JSON {"restricted": bool, "terms": [nodeSelectorTerm]}:
     on no node of another group. A node is in a group when it has every label of the group's
     nodeSelector, so it is outside all of them when, for each group, one of its labels is
     missing or differs: one term (the terms are ORed, the expressions of a term ANDed) per choice
     of one label in each group, each label as `NotIn` (which a node without the label passes),
     as deploy/node-groups does. A label the common nodeSelector requires with the same value
     cannot tell the groups apart and is skipped. Not restricted when no other group exists. */}}
{{- define "hpp.otherNodesTerms" -}}
{{- $common := .Values.nodeSelector | default dict }}
{{- $terms := list (list) }}
{{- $others := 0 }}
{{- range $group := .Values.nodeGroups }}
{{- if not $group.otherNodes }}
{{- $others = add1 $others }}
{{- $next := list }}
{{- range $term := $terms }}
{{- range $key := keys ($group.nodeSelector | default dict) | sortAlpha }}
{{- $value := toString (get $group.nodeSelector $key) }}
{{- if not (and (hasKey $common $key) (eq (toString (get $common $key)) $value)) }}
{{- $next = append $next (append $term (dict "key" $key "value" $value)) }}
{{- end }}
{{- end }}
{{- end }}
{{- $terms = $next }}
{{- end }}
{{- end }}
{{- $out := list }}
{{- $seen := dict }}
{{- range $term := $terms }}
{{- $byKey := dict }}
{{- range $term }}
{{- $_ := set $byKey .key (append (get $byKey .key | default list) .value | uniq | sortAlpha) }}
{{- end }}
{{- $expressions := list }}
{{- range $key := keys $byKey | sortAlpha }}
{{- $expressions = append $expressions (dict "key" $key "operator" "NotIn" "values" (get $byKey $key)) }}
{{- end }}
{{- $id := toJson $expressions }}
{{- if not (hasKey $seen $id) }}
{{- $_ := set $seen $id true }}
{{- $out = append $out (dict "matchExpressions" $expressions) }}
{{- end }}
{{- end }}
{{- dict "restricted" (gt $others 0) "terms" $out | toJson }}
{{- end }}

{{/* The nodes some DaemonSet of the chart runs on, beyond the common nodeSelector and affinity,
     as JSON {"restricted": bool, "terms": [nodeSelectorTerm]}: with node groups and no
     `otherNodes` group, the nodes of one of the groups (one term per group, its labels as `In`). */}}
{{- define "hpp.servedNodesTerms" -}}
{{- $terms := list }}
{{- $everyNode := not .Values.nodeGroups }}
{{- range $group := .Values.nodeGroups }}
{{- if $group.otherNodes }}
{{- $everyNode = true }}
{{- else }}
{{- $expressions := list }}
{{- range $key := keys ($group.nodeSelector | default dict) | sortAlpha }}
{{- $expressions = append $expressions (dict "key" $key "operator" "In" "values" (list (toString (get $group.nodeSelector $key)))) }}
{{- end }}
{{- $terms = append $terms (dict "matchExpressions" $expressions) }}
{{- end }}
{{- end }}
{{- dict "restricted" (not $everyNode) "terms" (ternary list $terms $everyNode) | toJson }}
{{- end }}

{{/* An affinity (.affinity) whose required node affinity also demands one of .terms: each of its
     own nodeSelectorTerms (or an empty one) combined with each of .terms, since terms are ORed
     and the expressions within a term ANDed. As YAML; .affinity unchanged when .terms is empty. */}}
{{- define "hpp.withNodeTerms" -}}
{{- $affinity := deepCopy (.affinity | default dict) }}
{{- if .terms }}
{{- $node := get $affinity "nodeAffinity" | default dict }}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict }}
{{- $theirs := get $required "nodeSelectorTerms" | default (list dict) }}
{{- $combined := list }}
{{- range $their := $theirs }}
{{- range $ours := $.terms }}
{{- $term := deepCopy $their }}
{{- $_ := set $term "matchExpressions" (concat (get $their "matchExpressions" | default list) $ours.matchExpressions) }}
{{- $combined = append $combined $term }}
{{- end }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $combined }}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ := set $affinity "nodeAffinity" $node }}
{{- end }}
{{- if $affinity }}{{ toYaml $affinity }}{{ end }}
{{- end }}

{{/* Whether a class of storageClasses (.) provisions a claim with no node named on it:
     WaitForFirstConsumer (the pod's node makes it), or Immediate with topology shared or
     everyNode. An Immediate class of node volumes waits for kubevirt.io/provisionOnNode. */}}
{{- define "hpp.needsNoNodeAnnotation" -}}
{{- if or (eq (.volumeBindingMode | default "WaitForFirstConsumer") "WaitForFirstConsumer") (has (toString ((.parameters | default dict).topology)) (list "shared" "everyNode")) }}true{{ end }}
{{- end }}

{{/* The class of the `helm test` claim: tests.storageClass, else the first class of
     storageClasses that needs no node annotation. Never an Immediate class of node volumes: its
     claim waits for a node named in kubevirt.io/provisionOnNode, which the test cannot know, so
     `helm test` would hang to its timeout. */}}
{{- define "hpp.testClass" -}}
{{- $chosen := "" }}
{{- if .Values.tests.storageClass }}
{{- $chosen = .Values.tests.storageClass }}
{{- range .Values.storageClasses }}
{{- if and (eq .name $chosen) (not (include "hpp.needsNoNodeAnnotation" .)) }}
{{- fail (printf "tests.storageClass: %s binds Immediate and makes node volumes: its claim would wait for a kubevirt.io/provisionOnNode annotation and `helm test` would hang; name a WaitForFirstConsumer class, or set tests.enabled=false" $chosen) }}
{{- end }}
{{- end }}
{{- else }}
{{- range .Values.storageClasses }}
{{- if and (not $chosen) (include "hpp.needsNoNodeAnnotation" .) }}{{ $chosen = .name }}{{ end }}
{{- end }}
{{- end }}
{{- required "tests.storageClass: storageClasses has no WaitForFirstConsumer class for the `helm test` claim (the claim of an Immediate class of node volumes waits for a node annotation): add one, name a class of this provisioner, or set tests.enabled=false" $chosen }}
{{- end }}

{{/* The test pod's name label: not the provisioner pods' (see templates/tests/volume.yaml), within
     the 63 characters of a label value. */}}
{{- define "hpp.testName" -}}
{{ include "hpp.name" . | trunc 58 | trimSuffix "-" }}-test
{{- end }}
