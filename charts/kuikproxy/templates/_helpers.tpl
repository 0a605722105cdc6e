{{/*
The chart name, or nameOverride.
*/}}
{{- define "kuikproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
A fully qualified app name, at most 63 characters (DNS label); the release name alone when it
already contains the chart name.
*/}}
{{- define "kuikproxy.fullname" -}}
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

{{/*
The chart label: name and version.
*/}}
{{- define "kuikproxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object. Argument: (list $ "component").
*/}}
{{- define "kuikproxy.labels" -}}
{{- $ctx := index . 0 -}}
helm.sh/chart: {{ include "kuikproxy.chart" $ctx }}
{{ include "kuikproxy.selectorLabels" . }}
{{- if $ctx.Chart.AppVersion }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
{{- end }}

{{/*
Selector labels. Argument: (list $ "component").
*/}}
{{- define "kuikproxy.selectorLabels" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: {{ include "kuikproxy.name" $ctx }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
The component of the workload this release runs: the proxy (mode service) or the injector's
webhook (mode injector).
*/}}
{{- define "kuikproxy.component" -}}
{{- if eq .Values.mode "injector" }}injector{{ else }}proxy{{ end }}
{{- end }}

{{/*
The ServiceAccount of the pods.
*/}}
{{- define "kuikproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kuikproxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The kuikproxy image, tag defaulting to the chart's appVersion.
*/}}
{{- define "kuikproxy.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{/* Names shared by several templates. */}}
{{- define "kuikproxy.configMapName" -}}
{{- printf "%s-config" (include "kuikproxy.fullname" .) }}
{{- end }}

{{- define "kuikproxy.injectorServiceName" -}}
{{- printf "%s-injector" (include "kuikproxy.fullname" .) }}
{{- end }}

{{- define "kuikproxy.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "kuikproxy.fullname" .) }}
{{- end }}

{{- define "kuikproxy.caSecretName" -}}
{{- .Values.injector.ca.existingSecret | default (printf "%s-ca" (include "kuikproxy.fullname" .)) }}
{{- end }}

{{/*
Where kuikproxy finds its files, in the chart's pods and in injected sidecars alike: the paths
`kuikproxy inject-webhook` mounts the sidecar's volumes at (kuikproxy/inject/patch.py).
*/}}
{{- define "kuikproxy.configDir" -}}/etc/kuikproxy{{- end }}
{{- define "kuikproxy.stateDir" -}}/var/lib/kuikproxy{{- end }}
{{- define "kuikproxy.storeDir" -}}/var/cache/kuikproxy{{- end }}
{{- define "kuikproxy.caDir" -}}/etc/kuikproxy/ca{{- end }}
{{- define "kuikproxy.port" -}}7439{{- end }}

{{/*
The namespaces whose pods the injector may inject (mode injector): each gets the sidecar's
config ConfigMap and CA Secret.
*/}}
{{- define "kuikproxy.injectorNamespaces" -}}
{{- if .Values.injector.namespaces }}
{{- .Values.injector.namespaces | uniq | toJson }}
{{- else }}
{{- list .Release.Namespace | toJson }}
{{- end }}
{{- end }}

{{/*
The kuikproxy config file (SPEC §7), from .Values.config with the keys the chart owns:
`listen` (mode service: every address, for the Service; mode injector: loopback in each pod),
`state.path` on the state volume unless config sets it, in mode service with `store.enabled`
`cache.blobs.path` on the store volume unless config sets it, and in mode injector the forward
proxy with the CA the sidecar is given.
*/}}
{{- define "kuikproxy.config" -}}
{{- if not (kindIs "map" (.Values.config | default dict)) }}
{{- fail "config must be a mapping (the kuikproxy config file, SPEC §7)" }}
{{- end }}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- $state := get $config "state" | default dict }}
{{- if not (hasKey $state "path") }}
{{- $_ := set $state "path" (printf "%s/state.db" (include "kuikproxy.stateDir" .)) }}
{{- end }}
{{- $_ := set $config "state" $state }}
{{- if eq .Values.mode "injector" }}
{{- $_ := set $config "listen" (printf "127.0.0.1:%s" (include "kuikproxy.port" .)) }}
{{- $forward := get $config "forwardProxy" | default dict }}
{{- $_ := set $forward "enabled" true }}
{{- $ca := dict "certFile" (printf "%s/tls.crt" (include "kuikproxy.caDir" .)) "keyFile" (printf "%s/tls.key" (include "kuikproxy.caDir" .)) }}
{{- $_ := set $forward "ca" $ca }}
{{- $_ := set $config "forwardProxy" $forward }}
{{- else }}
{{- $_ := set $config "listen" (printf "0.0.0.0:%s" (include "kuikproxy.port" .)) }}
{{- if .Values.store.enabled }}
{{- $cache := get $config "cache" | default dict }}
{{- $blobs := get $cache "blobs" | default dict }}
{{- if not (get $blobs "path") }}
{{- $_ := set $blobs "path" (printf "%s/blobs" (include "kuikproxy.storeDir" .)) }}
{{- end }}
{{- $_ := set $cache "blobs" $blobs }}
{{- $_ := set $config "cache" $cache }}
{{- end }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
Refuse values that cannot work, with a message that says why.
*/}}
{{- define "kuikproxy.validate" -}}
{{- if not (has .Values.mode (list "service" "injector")) }}
{{- fail (printf "mode must be \"service\" or \"injector\", not %q" (toString .Values.mode)) }}
{{- end }}
{{- if not (has .Values.webhook.failurePolicy (list "Ignore" "Fail")) }}
{{- fail "webhook.failurePolicy must be Ignore or Fail" }}
{{- end }}
{{- if not (has .Values.webhook.reinvocationPolicy (list "Never" "IfNeeded")) }}
{{- fail "webhook.reinvocationPolicy must be Never or IfNeeded" }}
{{- end }}
{{- end }}

{{/*
The webhook's serving certificate when the chart makes it (no cert-manager), as JSON
{"ca", "crt", "key"} of base64 PEM: the one in the cluster's Secret when there is one (so an
upgrade keeps it), else a new CA and a certificate for the webhook Service's names. Made once
per render and remembered, so the Secret, the caBundle and the pod's checksum agree.
*/}}
{{- define "kuikproxy.webhookCert" -}}
{{- if not (hasKey .Values "__kuikproxyWebhookCert") }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "kuikproxy.webhookSecretName" .) }}
{{- $data := dict }}
{{- if $secret }}{{ $data = $secret.data | default dict }}{{ end }}
{{- $cert := dict }}
{{- if and (index $data "ca.crt") (index $data "tls.crt") (index $data "tls.key") }}
{{- $cert = dict "ca" (index $data "ca.crt") "crt" (index $data "tls.crt") "key" (index $data "tls.key") }}
{{- else }}
{{- $service := include "kuikproxy.injectorServiceName" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list $service (printf "%s.%s" $service $ns) (printf "%s.%s.svc" $service $ns) (printf "%s.%s.svc.cluster.local" $service $ns) }}
{{- $days := int .Values.webhook.generatedCert.validityDays }}
{{- $ca := genCA (printf "%s-webhook-ca" (include "kuikproxy.fullname" .)) $days }}
{{- $leaf := genSignedCert (printf "%s.%s.svc" $service $ns) nil $names $days $ca }}
{{- $cert = dict "ca" ($ca.Cert | b64enc) "crt" ($leaf.Cert | b64enc) "key" ($leaf.Key | b64enc) }}
{{- end }}
{{- $_ := set .Values "__kuikproxyWebhookCert" $cert }}
{{- end }}
{{- index .Values "__kuikproxyWebhookCert" | toJson }}
{{- end }}
