package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/server"
)

// compatFlags are the server flags of the client-compatibility surfaces
// (E2B, SandboxFusion, SWE-ReX).
type compatFlags struct {
	fusionPrefix string
	fusionLayers layerFlag
	e2bOff       bool
	e2bTemplates templateFlag
	e2bDomain    string
	e2bMemoryMB  int64
}

func (c *compatFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.fusionPrefix, "sandboxfusion-prefix", server.DefaultFusionPrefix,
		"where SandboxFusion's /run_code and /v1/ping are served (\"/\" for the root, \"-\" for nowhere)")
	c.fusionLayers = layerFlag{Base: server.DefaultFusionBase}
	fs.Var(&c.fusionLayers, "sandboxfusion-layers",
		"layers of the sandboxes /run_code runs in: base=REF[,workspace=REF][,toolkit=REF] (make sandboxfusion-base builds "+server.DefaultFusionBase+")")
	fs.BoolVar(&c.e2bOff, "no-e2b", false, "do not serve E2B's API (/sandboxes, /v2/sandboxes and envd by E2b-Sandbox-Id) beside /v1")
	fs.Var(&c.e2bTemplates, "e2b-templates",
		"E2B template ids and the base layers they create: NAME=REF[,NAME=REF...] (default base=debian:12; an unlisted template is taken as a layer ref)")
	fs.Int64Var(&c.e2bMemoryMB, "e2b-memory-mb", 0, "memory limit of the sandboxes E2B creates (0: the server's default)")
	fs.StringVar(&c.e2bDomain, "e2b-domain", "", "the sandbox domain E2B clients are told (for getHost: PORT-ID.DOMAIN must resolve to this server)")
}

func (c *compatFlags) config() server.CompatConfig {
	cfg := server.CompatConfig{FusionPrefix: c.fusionPrefix}
	cfg.Fusion.Layers = api.LayerRefs(c.fusionLayers)
	cfg.E2BOff, cfg.E2B.Templates, cfg.E2B.Domain = c.e2bOff, c.e2bTemplates, c.e2bDomain
	cfg.E2B.Resources.MemoryMB = c.e2bMemoryMB
	return cfg
}

// templateFlag is an E2B template table: NAME=REF,NAME=REF.
type templateFlag map[string]api.LayerRefs

func (t *templateFlag) String() string {
	if t == nil || *t == nil {
		return ""
	}
	var parts []string
	for k, v := range *t {
		parts = append(parts, k+"="+v.Base)
	}
	return strings.Join(parts, ",")
}

func (t *templateFlag) Set(v string) error {
	m := map[string]api.LayerRefs{}
	for part := range strings.SplitSeq(v, ",") {
		name, ref, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" || ref == "" {
			return fmt.Errorf("e2b template %q: want NAME=LAYER-REF", part)
		}
		m[name] = api.LayerRefs{Base: ref}
	}
	*t = m
	return nil
}

// layerFlag is a layer stack written base=REF,workspace=REF,toolkit=REF.
type layerFlag api.LayerRefs

func (l *layerFlag) String() string {
	if l == nil {
		return ""
	}
	s := "base=" + l.Base
	if l.Workspace != "" {
		s += ",workspace=" + l.Workspace
	}
	if l.Toolkit != "" {
		s += ",toolkit=" + l.Toolkit
	}
	return s
}

func (l *layerFlag) Set(v string) error {
	refs, err := parseLayerStack(v)
	if err != nil {
		return err
	}
	*l = layerFlag(refs)
	return nil
}

// parseLayerStack reads base=REF[,workspace=REF][,toolkit=REF]; a bare
// REF is the base.
func parseLayerStack(v string) (api.LayerRefs, error) {
	var refs api.LayerRefs
	for part := range strings.SplitSeq(v, ",") {
		k, ref, ok := strings.Cut(part, "=")
		if !ok {
			k, ref = "base", part
		}
		switch k {
		case "base":
			refs.Base = ref
		case "workspace":
			refs.Workspace = ref
		case "toolkit":
			refs.Toolkit = ref
		default:
			return refs, fmt.Errorf("layer stack %q: %q is not base, workspace or toolkit", v, k)
		}
	}
	if refs.Base == "" {
		return refs, fmt.Errorf("layer stack %q: base is required", v)
	}
	return refs, nil
}
