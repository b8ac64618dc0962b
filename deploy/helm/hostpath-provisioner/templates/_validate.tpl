{{- /* Render-time checks of what the binary would refuse at start (its pods would exit with a
     configuration error and the rollout would stall) or what would reach the cluster broken.
     values.schema.json refuses what a pattern can say; what needs several values, or arithmetic,
     is here. Every message names the value and the reason. */ -}}

{{/* Why a Kubernetes quantity (already in the schema's grammar) is refused by the binary, or "":
     it reads sizes into 64 bits, from at most 30 significant digits and exponents within ±30. */}}
{{- define "hpp.quantityProblem" -}}
{{- $quantity := toString . | trim }}
{{- $number := regexReplaceAll "^[+-]?([0-9.]*).*$" $quantity "${1}" }}
{{- $suffix := regexReplaceAll "^[+-]?[0-9.]*(.*)$" $quantity "${1}" }}
{{- $digits := regexReplaceAll "^0+" (replace "." "" $number) "" }}
{{- $multipliers := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 }}
{{- $multiplier := get $multipliers $suffix | default 1.0 }}
{{- $exponent := 0 }}
{{- if regexMatch "^[eE][+-]?[0-9]+$" $suffix }}
{{- $exponent = substr 1 (len $suffix) $suffix | trimPrefix "+" | atoi }}
{{- $multiplier = float64 (printf "1e%d" $exponent) }}
{{- end }}
{{- if or (gt $exponent 30) (lt $exponent -30) }}an exponent beyond ±30
{{- else if gt (len $digits) 30 }}more than 30 significant digits
{{- else if ge (mulf (float64 (default "0" $number)) $multiplier) 18446744073709551616.0 }}2^64 bytes (16Ei) or more
{{- end }}
{{- end }}

{{/* Why a pool path is refused, or "". The path is written as-is into every PV and is the mount
     path in the pod, so it must be the path the binary settles on: absolute and clean. */}}
{{- define "hpp.pathProblem" -}}
{{- $path := toString . }}
{{- if contains "," $path }}it contains ',', which separates the pools in STORAGE_POOLS and in the pools a node advertises
{{- else if not (regexMatch "^(/[^/]+)+$" $path) }}it must be an absolute path other than /, without empty segments or a trailing /
{{- else if regexMatch "(^|/)\\.\\.?(/|$)" $path }}it has a . or .. segment
{{- else if ne $path (trim $path) }}it ends in white space, which STORAGE_POOLS drops
{{- end }}
{{- end }}

{{- define "hpp.validate" -}}
{{- $groups := (include "hpp.groups" . | fromJson).groups }}
{{- /* Node groups: DNS labels, once each; each either selects its nodes or takes the others. */}}
{{- $names := dict }}
{{- $others := list }}
{{- range $i, $a := .Values.nodeGroups }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" (toString $a.name)) }}{{ fail (printf "nodeGroups: name %q is not a DNS label" (toString $a.name)) }}{{ end }}
{{- if hasKey $names $a.name }}{{ fail (printf "nodeGroups: %q is listed twice" $a.name) }}{{ end }}
{{- $_ := set $names $a.name true }}
{{- if $a.otherNodes }}
{{- if $a.nodeSelector }}{{ fail (printf "nodeGroups: %s has otherNodes: true and a nodeSelector; the group of the other nodes selects them by the other groups' labels, so give it no nodeSelector" $a.name) }}{{ end }}
{{- $others = append $others $a.name }}
{{- else if not $a.nodeSelector }}
{{- fail (printf "nodeGroups: %s needs a nodeSelector (the groups must select different nodes), or otherNodes: true to take every node no other group selects" $a.name) }}
{{- end }}
{{- end }}
{{- if gt (len $others) 1 }}{{ fail (printf "nodeGroups: %s all have otherNodes: true; only one group can take the nodes no other group selects" (join ", " $others)) }}{{ end }}
{{- range $i, $a := .Values.nodeGroups }}
{{- range $j, $b := $.Values.nodeGroups }}
{{- if and (lt $i $j) (not $a.otherNodes) (not $b.otherNodes) }}
{{- $apart := false }}
{{- range $key, $value := $a.nodeSelector }}
{{- if and (hasKey $b.nodeSelector $key) (ne (toString $value) (toString (get $b.nodeSelector $key))) }}{{ $apart = true }}{{ end }}
{{- end }}
{{- if not $apart }}{{ fail (printf "nodeGroups: %s and %s may select the same node: give their nodeSelectors a label key with a different value in each (two provisioners on one node would both act on its claims)" $a.name $b.name) }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- if $others }}
{{- $placement := include "hpp.otherNodesTerms" . | fromJson }}
{{- if and $placement.restricted (not $placement.terms) }}{{ fail (printf "nodeGroups: %s (otherNodes) would get no node: every label of some group's nodeSelector is also in the common nodeSelector, so that group takes every node" (first $others)) }}{{ end }}
{{- end }}

{{- /* Pools of each group: what the binary checks in PV_DIR and STORAGE_POOLS. */}}
{{- range $group := $groups }}
{{- $where := ternary (printf "nodeGroups[%s].pools" $group.name) "pools" (ne $group.name "") }}
{{- if not $group.pools }}{{ fail (printf "%s: at least one pool is needed" $where) }}{{ end }}
{{- $seen := dict }}
{{- range $group.pools }}
{{- $pool := . }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" (toString .name)) }}{{ fail (printf "%s: name %q is not a DNS label" $where (toString .name)) }}{{ end }}
{{- /* A name listed again is one pool over several disks (legacy: PV_DIR and more roots), node-local. */}}
{{- if hasKey $seen .name }}
{{- if or .shared (get $seen .name) }}{{ fail (printf "%s: %q is listed twice with shared: a shared pool is one network filesystem, one path" $where .name) }}{{ end }}
{{- end }}
{{- $_ := set $seen .name (or (get $seen .name) (.shared | default false)) }}
{{- if has .name (list "reserve" "accounting") }}{{ fail (printf "%s: a pool cannot be named %q: in STORAGE_POOLS `%s=...` is an option of the pool before it" $where .name .name) }}{{ end }}
{{- with include "hpp.pathProblem" .path }}{{ fail (printf "%s: %s: path %q: %s" $where $pool.name (toString $pool.path) .) }}{{ end }}
{{- if and (eq .name "legacy") (or .shared .reserve .accounting) }}{{ fail (printf "%s: legacy is PV_DIR, a local pool with config.reservedSpace as its reserve and config.capacityAccounting as its accounting; give shared, reserved space or an accounting of its own to another pool" $where) }}{{ end }}
{{- if hasKey . "reserve" }}{{ with include "hpp.quantityProblem" .reserve }}{{ fail (printf "%s: %s: reserve %q: %s" $where $pool.name (toString $pool.reserve) .) }}{{ end }}{{ end }}
{{- if and (eq $.Values.config.pvCapacity "filesystem") (eq (.accounting | default $.Values.config.capacityAccounting) "requests") }}
{{- fail (printf "%s: %s counts requests (accounting: requests), which config.pvCapacity: filesystem refuses: the PVs then state the filesystem's size, not their requests" $where .name) }}
{{- end }}
{{- end }}
{{- range $i, $a := $group.pools }}
{{- range $j, $b := $group.pools }}
{{- if and (lt $i $j) (or (hasPrefix (printf "%s/" $a.path) (printf "%s/" $b.path)) (hasPrefix (printf "%s/" $b.path) (printf "%s/" $a.path))) }}
{{- fail (printf "%s: %s (%s) and %s (%s) are the same directory or one inside the other; a volume of one would be a directory of the other" $where $a.name $a.path $b.name $b.path) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- /* Settings of the binary that a schema pattern cannot check alone. */}}
{{- if not (kindIs "string" .Values.config.dirMode) }}{{ fail "config.dirMode must be a quoted octal string such as \"0777\" (unquoted, YAML reads 0777 as a number)" }}{{ end }}
{{- if gt (int64 .Values.config.nodeLeaseSeconds) 4294967295 }}{{ fail (printf "config.nodeLeaseSeconds %d: at most 4294967295 (the binary reads 32 bits)" (int64 .Values.config.nodeLeaseSeconds)) }}{{ end }}
{{- with include "hpp.quantityProblem" .Values.config.reservedSpace }}{{ fail (printf "config.reservedSpace %q: %s" (toString $.Values.config.reservedSpace) .) }}{{ end }}
{{- $reap := .Values.config.reapVolumesOfRemovedNodes | default "" | trim }}
{{- if and $reap (ne $reap "off") (not (regexMatch "[1-9]" $reap)) }}
{{- fail (printf "config.reapVolumesOfRemovedNodes %q is zero: leave it empty to turn reaping off, or give a positive duration such as 24h" $reap) }}
{{- end }}
{{- $release := .Values.config.releaseClaimsOfRemovedNodes | default "" | trim }}
{{- if and $release (ne $release "off") (not (regexMatch "[1-9]" $release)) }}
{{- fail (printf "config.releaseClaimsOfRemovedNodes %q is zero: leave it empty to keep claims of removed nodes, or give a positive duration such as 1h" $release) }}
{{- end }}
{{- $grace := .Values.config.orphanSnapshotCopyGrace | default "" | trim }}
{{- if not (regexMatch "[1-9]" $grace) }}
{{- fail (printf "config.orphanSnapshotCopyGrace %q is zero or empty: give a positive duration such as 1h" $grace) }}
{{- end }}
{{- if and .Values.config.publishCapacity (not .Values.config.capacityProvisionerName) (not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$" .Values.config.provisionerName)) }}
{{- fail (printf "config.publishCapacity needs config.capacityProvisionerName, or config.provisionerName, to be an object name such as hostpath.example.org (kube-scheduler reads published capacity through a CSIDriver of that name), not %q" .Values.config.provisionerName) }}
{{- end }}
{{- if and .Values.config.capacityProvisionerName (eq .Values.config.capacityProvisionerName .Values.config.provisionerName) }}
{{- fail "config.capacityProvisionerName: a second name, other than config.provisionerName" }}
{{- end }}
{{- range $service := list (include "hpp.peersService" .) (include "hpp.metricsService" .) }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $service) }}
{{- fail (printf "the Service name %q (from the release name or fullnameOverride) is not a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): set fullnameOverride" $service) }}
{{- end }}
{{- end }}
{{- end }}

{{- /* operator.enabled: the operator makes the node DaemonSet from the HostPathProvisioner
     resource. The values that have a field in the resource are carried into it
     (hpp.operatorSpec); the others would be dropped in silence, so they are refused, naming
     each one set and why (docs/operator.md, "The chart's operator mode"). Compared with the
     chart's own defaults (values.yaml). */}}
{{- define "hpp.validateOperatorMode" -}}
{{- $defaults := include "hpp.nodeDefaults" . | fromJson }}
{{- $where := dict
  "nodeGroups" "one HostPathProvisioner per group (docs/operator.md)"
  "extraEnv" "nowhere: the operator sets the node pods' environment from the resource"
  "tolerations" "spec.workload.tolerations of operator.resource"
  "nodeSelector" "spec.workload.nodeSelector of operator.resource"
  "affinity" "spec.workload.affinity of operator.resource"
  "resources" "nowhere: the operator gives the node pods the resources of deploy/legacy"
  "updateStrategy" "nowhere: the operator rolls its DaemonSet out itself"
  "priorityClassName" "nowhere: the operator's node pods are system-node-critical"
  "podAnnotations" "nowhere"
  "podLabels" "nowhere"
}}
{{- /* config values without a field in the resource (hpp.operatorConfigFields lists those
     with one). */}}
{{- $configWhere := dict
  "useNamingPrefix" "spec.pathConfig.useNamingPrefix of operator.resource"
  "nodeLeaseSeconds" "nowhere: the operator's node pods tell live peers by the peers Service, not by Leases"
  "listenAddress" "nowhere: the operator's probes, metrics Service and ServiceMonitor use the file's ports"
  "metricsPort" "nowhere: the operator's probes, metrics Service and ServiceMonitor use the file's ports"
  "healthPort" "nowhere: the operator's probes, metrics Service and ServiceMonitor use the file's ports"
}}
{{- $set := list }}
{{- range $key := keys $where | sortAlpha }}
{{- if ne (toJson (get $.Values $key)) (toJson (get $defaults $key)) }}
{{- $set = append $set (printf "%s (in operator mode: %s)" $key (get $where $key)) }}
{{- end }}
{{- end }}
{{- range $key := keys $configWhere | sortAlpha }}
{{- if ne (toJson (get $.Values.config $key)) (toJson (get $defaults.config $key)) }}
{{- $set = append $set (printf "config.%s (in operator mode: %s)" $key (get $configWhere $key)) }}
{{- end }}
{{- end }}
{{- if .Values.csiDriver.create }}
{{- $set = append $set "csiDriver.create (in operator mode the operator makes the CSIDriver itself when config.publishCapacity is true)" }}
{{- end }}
{{- if $set }}
{{- fail (printf "operator.enabled: the operator makes the node DaemonSet from the HostPathProvisioner resource, which has no field for these values of the chart's own DaemonSet: %s. Unset them, or install without operator mode" (join "; " $set)) }}
{{- end }}
{{- end }}

{{- /* The config values the HostPathProvisioner has a field for (spec.config, same names). */}}
{{- define "hpp.operatorConfigFields" -}}
["provisionerName", "capacityProvisionerName", "publishCapacity", "nodeAffinityKeys", "pvCapacity", "dirMode", "requireMountpoint", "pvFinalizer", "provisionOnNode", "reservedSpace", "capacityAccounting", "maxConcurrency", "orphanSnapshotCopyGrace", "reapVolumesOfRemovedNodes", "logFormat", "logLevel", "blockVolumes", "blockDeviceDir"]
{{- end }}

{{- /* The spec of the chart's HostPathProvisioner (JSON): operator.resource, with the chart's
     values that have a field carried into it: config.* into spec.config, quota.enabled into
     spec.quota, pools into spec.pathConfig (the legacy pool alone) or spec.storagePools. A value
     set both ways differently, or set with no operator.resource to carry it, is refused. */}}
{{- define "hpp.operatorSpec" -}}
{{- $defaults := include "hpp.nodeDefaults" . | fromJson }}
{{- $spec := deepCopy (.Values.operator.resource | default dict) }}
{{- $carried := list }}
{{- $config := deepCopy (get $spec "config" | default dict) }}
{{- range $key := include "hpp.operatorConfigFields" . | fromJsonArray }}
{{- $value := get $.Values.config $key }}
{{- if ne (toJson $value) (toJson (get $defaults.config $key)) }}
{{- if and (hasKey $config $key) (ne (toJson (get $config $key)) (toJson $value)) }}
{{- fail (printf "operator.enabled: config.%s and operator.resource.config.%s are both set, differently: set it in one place" $key $key) }}
{{- end }}
{{- $_ := set $config $key $value }}
{{- $carried = append $carried (printf "config.%s" $key) }}
{{- end }}
{{- end }}
{{- if $config }}{{ $_ := set $spec "config" $config }}{{ end }}
{{- /* The claim releaser is a field of its own (the operator makes its Deployment). */}}
{{- $release := .Values.config.releaseClaimsOfRemovedNodes | default "" | trim }}
{{- if and $release (ne $release "off") }}
{{- if and (hasKey $spec "releaseClaimsOfRemovedNodes") (ne (toString (get $spec "releaseClaimsOfRemovedNodes")) $release) }}
{{- fail "operator.enabled: config.releaseClaimsOfRemovedNodes and operator.resource.releaseClaimsOfRemovedNodes are both set, differently: set it in one place" }}
{{- end }}
{{- $_ := set $spec "releaseClaimsOfRemovedNodes" $release }}
{{- $carried = append $carried "config.releaseClaimsOfRemovedNodes" }}
{{- end }}
{{- if .Values.quota.enabled }}
{{- $quota := deepCopy (get $spec "quota" | default dict) }}
{{- if and (hasKey $quota "enabled") (not $quota.enabled) }}{{ fail "operator.enabled: quota.enabled and operator.resource.quota.enabled are both set, differently: set it in one place" }}{{ end }}
{{- $_ := set $quota "enabled" true }}
{{- $_ := set $spec "quota" $quota }}
{{- $carried = append $carried "quota.enabled" }}
{{- end }}
{{- if ne (toJson .Values.pools) (toJson $defaults.pools) }}
{{- if or (hasKey $spec "storagePools") (hasKey $spec "pathConfig") }}
{{- fail "operator.enabled: pools and operator.resource's storagePools or pathConfig are both set: set the pools in one place" }}
{{- end }}
{{- $pools := list }}
{{- $legacy := "" }}
{{- range .Values.pools }}
{{- if .shared }}{{ fail (printf "operator.enabled: pools: %s has shared: true, which the HostPathProvisioner has no field for (its shared pools are pools on a claim, spec.storagePools[].pvcTemplate)" .name) }}{{ end }}
{{- if eq (.hostPathType | default "DirectoryOrCreate") "Directory" }}{{ fail (printf "operator.enabled: pools: %s has hostPathType: Directory; the operator's pools are DirectoryOrCreate: remove hostPathType and set requireMountpoint: true to keep volumes off the root disk" .name) }}{{ end }}
{{- if eq .name "legacy" }}
{{- $legacy = .path }}
{{- else }}
{{- $pool := dict "name" .name "path" .path }}
{{- if hasKey . "reserve" }}{{ $_ := set $pool "reserve" (toString .reserve) }}{{ end }}
{{- if hasKey . "accounting" }}{{ $_ := set $pool "accounting" .accounting }}{{ end }}
{{- if hasKey . "requireMountpoint" }}{{ $_ := set $pool "requireMountpoint" .requireMountpoint }}{{ end }}
{{- $pools = append $pools $pool }}
{{- end }}
{{- end }}
{{- if and $legacy $pools }}
{{- fail "operator.enabled: pools has legacy (PV_DIR) and other pools; the HostPathProvisioner serves either spec.pathConfig (legacy alone) or spec.storagePools: rename legacy to carry them all as storage pools" }}
{{- end }}
{{- if $legacy }}
{{- $_ := set $spec "pathConfig" (dict "path" $legacy) }}
{{- else }}
{{- $_ := set $spec "storagePools" $pools }}
{{- end }}
{{- $carried = append $carried "pools" }}
{{- end }}
{{- if and $carried (not .Values.operator.resource) }}
{{- fail (printf "operator.enabled: the chart carries %s into the HostPathProvisioner it makes from operator.resource, but operator.resource is empty, so there is none: set operator.resource (at least its workload), or set these in the spec of your own resource" (join ", " $carried)) }}
{{- end }}
{{- toJson $spec }}
{{- end }}
