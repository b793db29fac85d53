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
}

func (c *compatFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.fusionPrefix, "sandboxfusion-prefix", server.DefaultFusionPrefix,
		"where SandboxFusion's /run_code and /v1/ping are served (\"/\" for the root, \"-\" for nowhere)")
	c.fusionLayers = layerFlag{Base: server.DefaultFusionBase}
	fs.Var(&c.fusionLayers, "sandboxfusion-layers",
		"layers of the sandboxes /run_code runs in: base=REF[,workspace=REF][,toolkit=REF] (make sandboxfusion-base builds "+server.DefaultFusionBase+")")
}

func (c *compatFlags) config() server.CompatConfig {
	cfg := server.CompatConfig{FusionPrefix: c.fusionPrefix}
	cfg.Fusion.Layers = api.LayerRefs(c.fusionLayers)
	return cfg
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
