{{/*
Names are fixed (one release per namespace): workers and the dashboard reach the controlplane as
levers9-controlplane:1993 and :1994 in the cluster.
*/}}
{{- define "levers9.name" -}}levers9-controlplane{{- end }}

{{- define "levers9.labels" -}}
app.kubernetes.io/name: levers9
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "levers9.selectorLabels" -}}
app.kubernetes.io/name: levers9
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controlplane
{{- end }}

{{/* image: repository, then @digest or :tag. */}}
{{- define "levers9.image" -}}
{{- if .digest -}}{{ .repository }}@{{ .digest }}{{- else -}}{{ .repository }}:{{ .tag }}{{- end -}}
{{- end }}

{{- define "levers9.workerRepository" -}}
{{- if .Values.images.worker.repository -}}
{{ .Values.images.worker.repository }}
{{- else -}}
{{ printf "%s/levers9-worker" (dir .Values.images.controlplane.repository) }}
{{- end -}}
{{- end }}

{{/* levers9.dashboardImage: (dict "img" images.dashboardApi "name" "levers9-dashboard-api" "root" .) */}}
{{- define "levers9.dashboardImage" -}}
{{- $repo := .img.repository | default (printf "%s/%s" (dir .root.Values.images.controlplane.repository) .name) -}}
{{- include "levers9.image" (dict "repository" $repo "tag" .img.tag "digest" .img.digest) -}}
{{- end }}

{{- define "levers9.dashboardSelectorLabels" -}}
app.kubernetes.io/name: levers9
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
levers9.secretKeys lists the keys under a map whose names look like secrets and whose values could
hold one (not a switch, not a map: maps are walked) (space-separated
dotted paths). Called with (dict "path" "config" "value" MAP).
*/}}
{{- define "levers9.secretKeys" -}}
{{- $path := .path -}}
{{- range $k, $v := .value -}}
{{- $p := printf "%s.%s" $path $k -}}
{{- if and (regexMatch "(?i)(password|passwd|secret|token|credential|encryptionkey|accesskey|privatekey|apikey|^key$|^keys$)" $k) (not (kindIs "bool" $v)) (not (kindIs "map" $v)) -}}{{ $p }} {{ end -}}
{{- if kindIs "map" $v -}}{{ include "levers9.secretKeys" (dict "path" $p "value" $v) }}{{- end -}}
{{- if kindIs "slice" $v -}}
{{- range $i, $item := $v -}}
{{- if kindIs "map" $item -}}{{ include "levers9.secretKeys" (dict "path" (printf "%s[%d]" $p $i) "value" $item) }}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
levers9.validate fails the render with every problem at once, each naming the value.
*/}}
{{- define "levers9.validate" -}}
{{- $errs := list -}}
{{- $v := .Values -}}
{{- if not $v.images.controlplane.repository -}}
{{- $errs = append $errs "images.controlplane.repository is required (REGISTRY/PREFIX/levers9-controlplane)" -}}
{{- end -}}
{{- if not (dig "worker" "imageRegistry" "" $v.config) -}}
{{- $errs = append $errs "config.worker.imageRegistry is required (where task images without a registry come from, host[:port])" -}}
{{- end -}}
{{- if not (dig "imageService" "runner" "baseImageRegistry" "" $v.config) -}}
{{- $errs = append $errs "config.imageService.runner.baseImageRegistry is required (where runner base images come from, host[:port][/prefix])" -}}
{{- end -}}
{{- if not $v.postgres.host -}}
{{- $errs = append $errs "postgres.host is required (Postgres is external)" -}}
{{- end -}}
{{- if not $v.redis.host -}}
{{- $errs = append $errs "redis.host is required (Redis is external)" -}}
{{- end -}}
{{- range $k := (include "levers9.secretKeys" (dict "path" "config" "value" $v.config) | splitList " " | compact) -}}
{{- $errs = append $errs (printf "%s looks like a secret: secrets never go under config: (it becomes a ConfigMap); put it in an existing Secret and name it in secrets.*, postgres.existingSecret or redis.existingSecret" $k) -}}
{{- end -}}
{{- range $k := list "database" "worker.pools" "controlplane.tls" "controlplane.grpcAddr" "controlplane.restAddr" "controlplane.tunnelAddr" "volumes.seaweedfs" -}}
{{- $parts := splitList "." $k -}}
{{- $val := $v.config -}}
{{- range $parts -}}{{- if kindIs "map" $val -}}{{- $val = get $val . -}}{{- else -}}{{- $val = "" -}}{{- end -}}{{- end -}}
{{- if $val -}}
{{- $errs = append $errs (printf "config.%s is set by the chart: use %s" $k (get (dict "database" "postgres: and redis:" "worker.pools" "pools:" "volumes.seaweedfs" "volumes.seaweedfs.{filerAddr,filerURL,securitySecret}" "controlplane.tls" "controlplane.tls.secretName" "controlplane.grpcAddr" "the Service (ports are fixed)" "controlplane.restAddr" "the Service (ports are fixed)" "controlplane.tunnelAddr" "the tunnel Service (ports are fixed)") $k)) -}}
{{- end -}}
{{- end -}}
{{- $tt := $v.tunnel.service.type -}}
{{- if not (has $tt (list "LoadBalancer" "NodePort")) -}}
{{- $errs = append $errs (printf "tunnel.service.type: %q is not LoadBalancer or NodePort" $tt) -}}
{{- end -}}
{{- range $name, $p := $v.pools -}}
{{- if not (regexMatch "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$" $name) -}}
{{- $errs = append $errs (printf "pools.%s: pool names are lower-case letters, digits and dashes" $name) -}}
{{- end -}}
{{- end -}}
{{- if $v.dashboard.enabled -}}
{{- $d := $v.dashboard -}}
{{- if not $d.api.publicUrl -}}
{{- $errs = append $errs "dashboard.api.publicUrl is required with dashboard.enabled (the API's URL as browsers reach it, https://...; the web image must be built for it)" -}}
{{- end -}}
{{- if not $d.web.url -}}
{{- $errs = append $errs "dashboard.web.url is required with dashboard.enabled (the web app's URL as browsers reach it, https://...)" -}}
{{- end -}}
{{- if not $d.api.googleClientId -}}
{{- $errs = append $errs "dashboard.api.googleClientId is required with dashboard.enabled (Google sign-in; the client secret goes in dashboard.api.envSecret)" -}}
{{- end -}}
{{- if not $d.api.allowedDomains -}}
{{- $errs = append $errs "dashboard.api.allowedDomains is required with dashboard.enabled (email domains that may sign in)" -}}
{{- end -}}
{{- if not $d.api.admins -}}
{{- $errs = append $errs "dashboard.api.admins is required with dashboard.enabled (emails or @domains that are admins)" -}}
{{- end -}}
{{- if not $d.api.envSecret.secretName -}}
{{- $errs = append $errs "dashboard.api.envSecret.secretName is required with dashboard.enabled (the existing Secret with the token, session secret and Google client secret)" -}}
{{- end -}}
{{- end -}}
{{- if $errs -}}
{{- fail (printf "\n%s" (join "\n" $errs)) -}}
{{- end -}}
{{- end }}

{{/* levers9.config is the controlplane's config file: config: with what the chart owns. */}}
{{- define "levers9.config" -}}
{{- $v := .Values -}}
{{- $c := deepCopy ($v.config | default dict) -}}
{{- $cp := get $c "controlplane" | default dict -}}
{{- $_ := set $cp "grpcAddr" ":1993" -}}
{{- $_ := set $cp "restAddr" ":1994" -}}
{{- $_ := set $cp "tunnelAddr" ":1995" -}}
{{- if not $cp.publicHost -}}{{- $_ := unset $cp "publicHost" -}}{{- end -}}
{{- if $v.controlplane.tls.secretName -}}
{{- $tls := dict "certFile" "/etc/levers9/tls/tls.crt" "keyFile" "/etc/levers9/tls/tls.key" -}}
{{- if $v.controlplane.tls.caKey -}}{{- $_ := set $tls "caFile" "/etc/levers9/tls/ca.crt" -}}{{- end -}}
{{- $_ := set $cp "tls" $tls -}}
{{- end -}}
{{- $_ := set $c "controlplane" $cp -}}
{{- $pg := dict "host" $v.postgres.host "port" (int $v.postgres.port) "user" $v.postgres.user "database" $v.postgres.database "sslMode" $v.postgres.sslMode -}}
{{- $rd := dict "addr" (printf "%s:%d" $v.redis.host (int $v.redis.port)) "db" (int $v.redis.db) -}}
{{- $_ := set $c "database" (dict "postgres" $pg "redis" $rd) -}}
{{- $w := get $c "worker" | default dict -}}
{{- $pools := dict -}}
{{- range $name, $p := $v.pools -}}
{{- $p = $p | default dict -}}
{{- if eq (get $p "provider" | default "machines") "kubernetes" -}}
{{- $_ := set $pools $name (pick $p "runtime" "gpuType" "nodeSelector" "shared" "workspaces" "security" "volumeMountValidation" "provider" "maxWorkers" "shape" "tolerations" "runtimeClassName" "idleTimeout" "podAnnotations") -}}
{{- else -}}
{{- /* The Kubernetes keys (tolerations, runtimeClassName, ...) apply to pools with provider kubernetes only. */ -}}
{{- $_ := set $pools $name (pick $p "runtime" "gpuType" "nodeSelector" "shared" "workspaces" "security" "volumeMountValidation" "provider") -}}
{{- end -}}
{{- end -}}
{{- $_ := set $w "pools" $pools -}}
{{- /* Pools with provider kubernetes: worker Jobs in worker.namespace, with the chart's worker image, dialing the controlplane Service. */ -}}
{{- $k := get $w "kubernetes" | default dict -}}
{{- $_ := set $k "namespace" (get $k "namespace" | default .Values.worker.namespace) -}}
{{- $_ := set $k "image" (get $k "image" | default (include "levers9.image" (dict "repository" (include "levers9.workerRepository" .) "tag" .Values.images.worker.tag "digest" .Values.images.worker.digest))) -}}
{{- $_ := set $k "controlplane" (get $k "controlplane" | default (printf "levers9-controlplane.%s.svc:1993" .Release.Namespace)) -}}
{{- with .Values.images.pullSecrets }}{{ $_ := set $k "imagePullSecrets" (get $k "imagePullSecrets" | default .) }}{{ end -}}
{{- $_ := set $w "kubernetes" $k -}}
{{- $_ := set $c "worker" $w -}}
{{- with $v.volumes.seaweedfs.filerAddr -}}
{{- $sw := dict "filerAddr" . "securityDir" (include "levers9.seaweedfsSecurityDir" $) -}}
{{- with $v.volumes.seaweedfs.filerURL }}{{ $_ := set $sw "filerURL" . }}{{ end -}}
{{- $_ := set $c "volumes" (dict "seaweedfs" $sw) -}}
{{- end -}}
{{- toYaml $c -}}
{{- end }}

{{/*
SeaweedFS's credentials (volumes.seaweedfs.securitySecret) reach the controlplane in two steps. The
Secret's volume is 0400, but a pod with an fsGroup gets its files 0440, group-owned by the fsGroup
(kubelet adds group read whatever defaultMode says), and the controlplane refuses keys others can
read. So the init container seaweedfs-credentials (the controlplane's own image, which has no shell)
copies them into a memory-backed emptyDir as the controlplane user's 0600 files and checks them;
only the init container mounts the Secret. Loosening the controlplane's check instead would loosen
it for every install, not only this pod.
*/}}
{{- define "levers9.seaweedfsSecretDir" -}}/etc/levers9/seaweedfs-secret{{- end }}
{{- define "levers9.seaweedfsDir" -}}/etc/levers9/seaweedfs{{- end }}
{{- define "levers9.seaweedfsSecurityDir" -}}{{ include "levers9.seaweedfsDir" . }}/security{{- end }}

{{/* levers9.secretEnv is one env entry from a Secret: (dict "name" ENV "ref" {secretName,key,optional}). */}}
{{- define "levers9.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .ref.secretName | quote }}
      key: {{ .ref.key | quote }}
      {{- if .ref.optional }}
      optional: true
      {{- end }}
{{- end }}
