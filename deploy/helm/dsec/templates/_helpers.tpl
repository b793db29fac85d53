{{- define "dsec.fullname" -}}
{{- printf "%s-dsec" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dsec.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "dsec.labels" -}}
app.kubernetes.io/name: dsec
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "dsec.secretName" -}}
{{- printf "%s-secrets" (include "dsec.fullname" .) -}}
{{- end -}}
