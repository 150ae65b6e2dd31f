{{/*
The chart's name, as nameOverride may replace it.
*/}}
{{- define "mailer-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The prefix of every object's name: fullnameOverride, else "<release>-<name>", or the
release name alone when it already holds the name. At most 63 characters (a label).
*/}}
{{- define "mailer-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "mailer-operator.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The labels that select the controller's pods. They never change in an upgrade.
*/}}
{{- define "mailer-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mailer-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The standard labels of every object of the release, and commonLabels.
*/}}
{{- define "mailer-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mailer-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: mailer
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The labels of the worker pods the operator makes for every pipeline (see
src/controller/objects/meta.rs; tests/chart.rs holds the two together).
*/}}
{{- define "mailer-operator.workerSelectorLabels" -}}
app.kubernetes.io/name: mailer-worker
app.kubernetes.io/managed-by: mailer-operator
{{- end -}}

{{/*
The ServiceAccount the controller runs as.
*/}}
{{- define "mailer-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mailer-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The controller's image: repository:tag, tag defaulting to the appVersion, and
@digest when one is given.
*/}}
{{- define "mailer-operator.image" -}}
{{- $image := printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- if .Values.image.digest -}}
{{- $image = printf "%s@%s" $image .Values.image.digest -}}
{{- end -}}
{{- $image -}}
{{- end -}}

{{/*
The Lease the replicas elect their leader with.
*/}}
{{- define "mailer-operator.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (include "mailer-operator.fullname" .) -}}
{{- end -}}

{{/*
What the controller does in a namespace it reconciles pipelines in: the rules of the
ClusterRole (all namespaces) or of each watched namespace's Role.
*/}}
{{- define "mailer-operator.pipelineRules" -}}
# Exactly what the controller calls (src/controller/kube/rbac.rs; tests/chart/rbac.rs holds
# these rules to that list both ways).
# Pipelines: watched, read, finalizer added and removed (patch), status written.
- apiGroups: ["mailer.dev"]
  resources: ["mailerpipelines"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["mailer.dev"]
  resources: ["mailerpipelines/status"]
  verbs: ["patch"]
# Owner references that block their owner's deletion need this.
- apiGroups: ["mailer.dev"]
  resources: ["mailerpipelines/finalizers"]
  verbs: ["update"]
# Each pipeline's worker Deployment, applied server-side and owned by the pipeline; it
# goes with the pipeline (garbage collection), never deleted by the operator.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The workers' RabbitMQ user Secret it applies; the connection, provider and
# default-user Secrets it reads and watches. Never deleted by the operator.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# A RabbitmqCluster (watched as metadata when its CRD is installed), and its Service
# for its management port.
- apiGroups: ["rabbitmq.com"]
  resources: ["rabbitmqclusters"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get"]
# KEDA's ScaledObject and TriggerAuthentication of a pipeline with
# spec.worker.autoscaling: applied server-side, removed when autoscaling is turned off.
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects", "triggerauthentications"]
  verbs: ["get", "create", "patch", "delete"]
# Events on pipelines.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/*
What the controller reads in a namespace that only holds RabbitmqClusters that
pipelines refer to: the cluster, its Service and its default user's Secret.
*/}}
{{- define "mailer-operator.rabbitmqClusterRules" -}}
- apiGroups: ["rabbitmq.com"]
  resources: ["rabbitmqclusters"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["services", "secrets"]
  verbs: ["get"]
{{- end -}}

{{/*
Checks of values that the schema cannot express.
*/}}
{{- define "mailer-operator.validate" -}}
{{- if and (not .Values.leaderElection.enabled) (gt (int .Values.replicas) 1) -}}
{{- fail "replicas > 1 needs leaderElection.enabled: true, or every replica would reconcile" -}}
{{- end -}}
{{- range $key, $_ := .Values.commonLabels -}}
{{- if or (hasPrefix "app.kubernetes.io/" $key) (hasPrefix "helm.sh/" $key) -}}
{{- fail (printf "commonLabels: %s is one of the chart's own labels; choose another key" $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.rbac.rabbitmqClusterNamespaces (not .Values.watchNamespaces) -}}
{{- fail "rbac.rabbitmqClusterNamespaces is only for watchNamespaces: watching all namespaces already reads RabbitmqClusters everywhere" -}}
{{- end -}}
{{- end -}}
