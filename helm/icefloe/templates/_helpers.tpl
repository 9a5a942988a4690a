{{/* Names: <release>-icefloe unless the release name already says icefloe. */}}
{{- define "icefloe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "icefloe.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* <fullname>-<component>, within the 63 characters Kubernetes allows. */}}
{{- define "icefloe.componentName" -}}
{{- printf "%s-%s" (include "icefloe.fullname" .root | trunc 50 | trimSuffix "-") .component -}}
{{- end -}}

{{- define "icefloe.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "icefloe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "icefloe.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "icefloe.labels" -}}
helm.sh/chart: {{ include "icefloe.chart" .root }}
{{ include "icefloe.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: icefloe
{{- end -}}

{{- define "icefloe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "icefloe.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "icefloe.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) -}}
{{- end -}}

{{/* The protocol the chart states explicitly; empty lets the services derive it. */}}
{{- define "icefloe.kafkaSecurityProtocol" -}}
{{- $k := .Values.kafka -}}
{{- if $k.securityProtocol -}}
{{- $k.securityProtocol -}}
{{- else if $k.tls.enabled -}}
{{- if $k.sasl.mechanism -}}SASL_SSL{{- else -}}SSL{{- end -}}
{{- end -}}
{{- end -}}

{{- define "icefloe.kafkaTlsMountPath" -}}/etc/icefloe/kafka-tls{{- end -}}

{{- define "icefloe.kafkaTlsMounted" -}}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.existingSecret -}}true{{- end -}}
{{- end -}}

{{/*
Non-secret Kafka settings as ConfigMap entries; `prefix` is ICEFLOE_ or ICEFLOE_PLANNER_.
*/}}
{{- define "icefloe.kafkaConfig" -}}
{{- $root := .root -}}
{{- $p := .prefix -}}
{{- $k := $root.Values.kafka -}}
{{ $p }}BROKERS: {{ required "kafka.brokers is required (host:port[,host:port])" $k.brokers | quote }}
{{- with include "icefloe.kafkaSecurityProtocol" $root }}
{{ $p }}SECURITY_PROTOCOL: {{ . | quote }}
{{- end }}
{{- if $k.sasl.mechanism }}
{{ $p }}SASL_MECHANISM: {{ $k.sasl.mechanism | quote }}
{{- end }}
{{- if include "icefloe.kafkaTlsMounted" $root }}
{{- $dir := include "icefloe.kafkaTlsMountPath" $root }}
{{- if $k.tls.caKey }}
{{ $p }}TLS_CAFILE: {{ printf "%s/%s" $dir $k.tls.caKey | quote }}
{{- end }}
{{- if ne (empty $k.tls.clientCertKey) (empty $k.tls.clientKeyKey) }}
{{- fail "kafka.tls.clientCertKey and kafka.tls.clientKeyKey must be set together" }}
{{- end }}
{{- if $k.tls.clientCertKey }}
{{ $p }}TLS_CERTFILE: {{ printf "%s/%s" $dir $k.tls.clientCertKey | quote }}
{{ $p }}TLS_KEYFILE: {{ printf "%s/%s" $dir $k.tls.clientKeyKey | quote }}
{{- end }}
{{- else if or $k.tls.clientCertKey $k.tls.keyPasswordKey }}
{{- fail "kafka.tls.clientCertKey/keyPasswordKey need kafka.tls.enabled and kafka.tls.existingSecret" }}
{{- end }}
{{- end -}}

{{/* Kafka secrets as container env entries (SASL credentials, TLS key password). */}}
{{- define "icefloe.kafkaSecretEnv" -}}
{{- $root := .root -}}
{{- $p := .prefix -}}
{{- $k := $root.Values.kafka -}}
{{- if $k.sasl.mechanism }}
{{- $secret := required "kafka.sasl.existingSecret is required when kafka.sasl.mechanism is set" $k.sasl.existingSecret }}
- name: {{ $p }}SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $k.sasl.usernameKey }}
- name: {{ $p }}SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $k.sasl.passwordKey }}
{{- end }}
{{- if and (include "icefloe.kafkaTlsMounted" $root) $k.tls.keyPasswordKey }}
- name: {{ $p }}TLS_KEY_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $k.tls.existingSecret }}
      key: {{ $k.tls.keyPasswordKey }}
{{- end }}
{{- end -}}

{{/* The catalog URI: a ConfigMap entry, unless it comes from a Secret. */}}
{{- define "icefloe.catalogConfig" -}}
{{- if not .root.Values.catalog.existingSecret.name }}
{{ .prefix }}CATALOG: {{ required "catalog.uri (or catalog.existingSecret.name) is required" .root.Values.catalog.uri | quote }}
{{- end }}
{{- end -}}

{{- define "icefloe.catalogSecretEnv" -}}
{{- with .root.Values.catalog.existingSecret }}
{{- if .name }}
- name: {{ $.prefix }}CATALOG
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Standard AWS variables: the services fall back to the AWS SDK's default chain. */}}
{{- define "icefloe.awsConfig" -}}
{{- with .Values.aws.region }}
AWS_REGION: {{ . | quote }}
{{- end }}
{{- with .Values.aws.s3EndpointUrl }}
AWS_ENDPOINT_URL_S3: {{ . | quote }}
{{- end }}
{{- with .Values.aws.dynamodbEndpointUrl }}
AWS_ENDPOINT_URL_DYNAMODB: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "icefloe.awsSecretEnv" -}}
{{- with .Values.aws.credentialsSecret }}
{{- if .name }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .secretAccessKeyKey }}
{{- if .sessionTokenKey }}
- name: AWS_SESSION_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .sessionTokenKey }}
      optional: true
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod annotations shared by both components: scrape hints and config checksums. */}}
{{- define "icefloe.podAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
checksum/config: {{ .checksum }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* HTTP probes on the port named "http": /healthz for liveness/startup, /readyz for readiness. */}}
{{- define "icefloe.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: http
  periodSeconds: {{ .startup.periodSeconds }}
  timeoutSeconds: {{ .startup.timeoutSeconds }}
  failureThreshold: {{ .startup.failureThreshold }}
livenessProbe:
  httpGet:
    path: /healthz
    port: http
  periodSeconds: {{ .liveness.periodSeconds }}
  timeoutSeconds: {{ .liveness.timeoutSeconds }}
  failureThreshold: {{ .liveness.failureThreshold }}
readinessProbe:
  httpGet:
    path: /readyz
    port: http
  periodSeconds: {{ .readiness.periodSeconds }}
  timeoutSeconds: {{ .readiness.timeoutSeconds }}
  failureThreshold: {{ .readiness.failureThreshold }}
{{- end -}}

{{/* Volumes every pod has: a writable /tmp and, with TLS files, the Kafka TLS Secret. */}}
{{- define "icefloe.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- if include "icefloe.kafkaTlsMounted" . }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "icefloe.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if include "icefloe.kafkaTlsMounted" . }}
- name: kafka-tls
  mountPath: {{ include "icefloe.kafkaTlsMountPath" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* Container env of each component: secret references, then the user's extraEnv. */}}
{{- define "icefloe.coordinatorEnv" -}}
{{- with include "icefloe.catalogSecretEnv" (dict "root" . "prefix" "ICEFLOE_") | trim }}
{{ . }}
{{- end }}
{{- with include "icefloe.kafkaSecretEnv" (dict "root" . "prefix" "ICEFLOE_") | trim }}
{{ . }}
{{- end }}
{{- with include "icefloe.awsSecretEnv" . | trim }}
{{ . }}
{{- end }}
{{- with .Values.coordinator.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "icefloe.plannerEnv" -}}
{{- $p := .Values.planner -}}
{{- with include "icefloe.catalogSecretEnv" (dict "root" . "prefix" "ICEFLOE_PLANNER_") | trim }}
{{ . }}
{{- end }}
{{- if $p.useKafka }}
{{- with include "icefloe.kafkaSecretEnv" (dict "root" . "prefix" "ICEFLOE_PLANNER_") | trim }}
{{ . }}
{{- end }}
{{- end }}
{{- with $p.token.existingSecret }}
- name: ICEFLOE_PLANNER_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $p.token.key }}
{{- end }}
{{- with $p.token.scope }}
- name: ICEFLOE_PLANNER_TOKEN_SCOPE
  value: {{ . | quote }}
{{- end }}
{{- $vend := $p.accessDelegation }}
{{- if eq $vend.vendedCredentials "static" }}
{{- $s := $vend.staticSecret }}
{{- $name := required "planner.accessDelegation.staticSecret.existingSecret is required with vendedCredentials: static" $s.existingSecret }}
{{- range $env, $key := dict "ICEFLOE_REST_VEND_READ_ACCESS_KEY_ID" $s.readAccessKeyIdKey "ICEFLOE_REST_VEND_READ_SECRET_ACCESS_KEY" $s.readSecretAccessKeyKey "ICEFLOE_REST_VEND_WRITE_ACCESS_KEY_ID" $s.writeAccessKeyIdKey "ICEFLOE_REST_VEND_WRITE_SECRET_ACCESS_KEY" $s.writeSecretAccessKeyKey }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $name }}
      key: {{ $key }}
{{- end }}
{{- end }}
{{- with include "icefloe.awsSecretEnv" . | trim }}
{{ . }}
{{- end }}
{{- with $p.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}
