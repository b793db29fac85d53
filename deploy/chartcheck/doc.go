// Package chartcheck renders the Helm chart in deploy/helm/dsec with Helm's
// own Go library and checks what it renders: every object decodes strictly
// into its Kubernetes type, the edge keeps its sandboxes on the host, the
// flags the chart passes exist in the dsec binary, and the plain manifests
// in deploy/manifests are the chart's default rendering. It lives in a
// module of its own so the main module does not depend on Helm. It must
// never talk to a cluster.
package chartcheck
