package chartcheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir      = "../helm/dsec"
	manifestsFile = "../manifests/dsec.yaml"
	release       = "dsec"
	namespace     = "dsec"
)

// objects is one rendering, decoded.
type objects struct {
	server  appsv1.Deployment
	edge    appsv1.DaemonSet
	service corev1.Service
	secrets []corev1.Secret
	text    string // the rendering as one multi-document YAML stream
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return ch
}

func render(t *testing.T, vals map[string]any) (*objects, error) {
	t.Helper()
	ch := loadChart(t)
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		if strings.HasSuffix(n, ".yaml") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var o objects
	var stream strings.Builder
	for _, n := range names {
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(files[n], -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			stream.WriteString("---\n# Source: " + filepath.ToSlash(n) + "\n" + strings.TrimLeft(doc, "\n"))
			if !strings.HasSuffix(doc, "\n") {
				stream.WriteString("\n")
			}
			if err := decode(t, doc, &o); err != nil {
				t.Fatalf("%s: %v\n%s", n, err, doc)
			}
		}
	}
	o.text = stream.String()
	return &o, nil
}

// decode reads one object strictly: a field the Kubernetes type does not
// have is an error, so a misspelt key fails here and not at kubectl apply.
func decode(t *testing.T, doc string, o *objects) error {
	t.Helper()
	var meta struct{ Kind string }
	if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
		return err
	}
	switch meta.Kind {
	case "Deployment":
		return yaml.UnmarshalStrict([]byte(doc), &o.server)
	case "DaemonSet":
		return yaml.UnmarshalStrict([]byte(doc), &o.edge)
	case "Service":
		return yaml.UnmarshalStrict([]byte(doc), &o.service)
	case "Secret":
		var s corev1.Secret
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			return err
		}
		o.secrets = append(o.secrets, s)
		return nil
	}
	t.Fatalf("unexpected kind %q", meta.Kind)
	return nil
}

func mustRender(t *testing.T, vals map[string]any) *objects {
	t.Helper()
	o, err := render(t, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return o
}

func TestDefaultRendering(t *testing.T) {
	o := mustRender(t, nil)

	if got := *o.server.Spec.Replicas; got != 2 {
		t.Errorf("server replicas %d, want 2", got)
	}
	sc := o.server.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"server", "--local-edge=false", "--db=$(DSEC_DB)", "--store=$(DSEC_STORE)"} {
		if !slices.Contains(sc.Args, want) {
			t.Errorf("server args %q lack %q", sc.Args, want)
		}
	}
	envFromSecret(t, sc, "DSEC_DB", "dsec-dsec-secrets")
	envFromSecret(t, sc, "DSEC_CLUSTER_TOKEN", "dsec-dsec-secrets")
	if o.service.Spec.Selector["app.kubernetes.io/component"] != "server" {
		t.Errorf("service selects %v, not the server", o.service.Spec.Selector)
	}
	if sel := o.server.Spec.Selector.MatchLabels; !subset(sel, o.server.Spec.Template.Labels) {
		t.Errorf("deployment selector %v does not match its pods %v", sel, o.server.Spec.Template.Labels)
	}

	// The edge: sandboxes on the host, outside the pod.
	ps := o.edge.Spec.Template.Spec
	if !ps.HostPID || !ps.HostNetwork {
		t.Errorf("edge hostPID=%v hostNetwork=%v, want both", ps.HostPID, ps.HostNetwork)
	}
	if ps.NodeSelector["dsec.dev/sandbox-node"] != "true" {
		t.Errorf("edge node selector %v", ps.NodeSelector)
	}
	ec := ps.Containers[0]
	if ec.SecurityContext == nil || ec.SecurityContext.Privileged == nil || !*ec.SecurityContext.Privileged {
		t.Error("edge is not privileged")
	}
	data := mountOf(t, ec, "data")
	if data.MountPropagation == nil || *data.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("edge data mount propagation %v, want Bidirectional", data.MountPropagation)
	}
	if v := volumeOf(t, ps, "data"); v.HostPath == nil || v.HostPath.Path != data.MountPath {
		t.Errorf("edge data volume %+v is not the host's %s", v, data.MountPath)
	}
	if v := volumeOf(t, ps, "cgroup"); v.HostPath == nil || v.HostPath.Path != "/sys/fs/cgroup" {
		t.Errorf("edge cgroup volume %+v is not the host's cgroup tree", v)
	}
	if !slices.Contains(ec.Args, "--join=http://dsec-dsec.dsec.svc:7070") {
		t.Errorf("edge does not join the service: %q", ec.Args)
	}
	envFromSecret(t, ec, "DSEC_EDGE_TOKEN", "dsec-dsec-secrets")
	if sel := o.edge.Spec.Selector.MatchLabels; !subset(sel, o.edge.Spec.Template.Labels) {
		t.Errorf("daemonset selector %v does not match its pods", sel)
	}
	if len(o.secrets) != 1 {
		t.Fatalf("%d secrets, want 1", len(o.secrets))
	}
}

func TestValues(t *testing.T) {
	o := mustRender(t, map[string]any{
		"server":       map[string]any{"replicas": 5, "database": map[string]any{"existingSecret": "pg"}},
		"store":        map[string]any{"existingSecret": "s3"},
		"clusterToken": map[string]any{"existingSecret": "tok"},
		"adminKey":     map[string]any{"existingSecret": "admin"},
		"edge":         map[string]any{"pool": "burst", "nodeSelector": map[string]any{"pool": "sandboxes"}},
	})
	if *o.server.Spec.Replicas != 5 {
		t.Errorf("replicas %d", *o.server.Spec.Replicas)
	}
	if len(o.secrets) != 0 {
		t.Errorf("a Secret is rendered although every value comes from an existing one")
	}
	sc := o.server.Spec.Template.Spec.Containers[0]
	envFromSecret(t, sc, "DSEC_DB", "pg")
	envFromSecret(t, sc, "DSEC_STORE", "s3")
	if m := mountOf(t, sc, "admin-key"); m.MountPath != "/var/lib/dsec/admin.key" || !m.ReadOnly {
		t.Errorf("admin key mount %+v", m)
	}
	ec := o.edge.Spec.Template.Spec.Containers[0]
	envFromSecret(t, ec, "DSEC_EDGE_TOKEN", "tok")
	if !slices.Contains(ec.Args, "--label=pool=burst") {
		t.Errorf("burst pool label missing: %q", ec.Args)
	}
	if o.edge.Spec.Template.Spec.NodeSelector["pool"] != "sandboxes" {
		t.Errorf("node selector %v", o.edge.Spec.Template.Spec.NodeSelector)
	}
}

func TestRequiredValues(t *testing.T) {
	_, err := render(t, map[string]any{"store": map[string]any{"url": ""}})
	if err == nil || !strings.Contains(err.Error(), "store.url is required") {
		t.Fatalf("render without a store: %v", err)
	}
}

// The plain manifests are the chart's default rendering, so the two never
// drift. DSEC_UPDATE_MANIFESTS=1 rewrites them.
func TestPlainManifests(t *testing.T) {
	o := mustRender(t, nil)
	want := "# Rendered from deploy/helm/dsec with its default values (release \"dsec\",\n" +
		"# namespace \"dsec\"). Edit the chart, not this file; regenerate with\n" +
		"#   cd deploy && DSEC_UPDATE_MANIFESTS=1 go test ./chartcheck\n" + o.text
	if os.Getenv("DSEC_UPDATE_MANIFESTS") == "1" {
		if err := os.WriteFile(manifestsFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(manifestsFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte(want)) {
		t.Fatalf("%s is not the chart's default rendering; regenerate it (DSEC_UPDATE_MANIFESTS=1)", manifestsFile)
	}
}

// Every flag the chart passes exists in the dsec binary named by DSEC_BIN
// (required under CI).
func TestFlagsExist(t *testing.T) {
	bin := os.Getenv("DSEC_BIN")
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("DSEC_BIN must name the dsec binary under CI")
		}
		t.Skip("DSEC_BIN not set")
	}
	o := mustRender(t, map[string]any{"edge": map[string]any{"pool": "burst"}})
	check := func(sub string, args []string) {
		out, _ := exec.Command(bin, sub, "-h").CombinedOutput()
		for _, a := range args[1:] {
			name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(name) + `\b`).Match(out) {
				t.Errorf("dsec %s has no flag -%s (chart passes %q)", sub, name, a)
			}
		}
	}
	check("server", o.server.Spec.Template.Spec.Containers[0].Args)
	check("edge", o.edge.Spec.Template.Spec.Containers[0].Args)
}

func envFromSecret(t *testing.T, c corev1.Container, name, secret string) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != secret {
				t.Errorf("%s: env %s is not from secret %s: %+v", c.Name, name, secret, e.ValueFrom)
			}
			return
		}
	}
	t.Errorf("%s: no env %s", c.Name, name)
}

func mountOf(t *testing.T, c corev1.Container, name string) corev1.VolumeMount {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("%s: no volume mount %s", c.Name, name)
	return corev1.VolumeMount{}
}

func volumeOf(t *testing.T, ps corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range ps.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no volume %s", name)
	return corev1.Volume{}
}

func subset(a, b map[string]string) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return len(a) > 0
}
