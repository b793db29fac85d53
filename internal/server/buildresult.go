package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// EnvWorkdir is the variable that gives a sandbox's agent the default cwd
// of its execs: a built layer's WORKDIR.
const EnvWorkdir = "DSEC_WORKDIR"

// finish records the last stage's state as name:tag: as it is (a snapshot
// on its stack), or flattened into one layer of kind through a sandbox of
// the stack whose node squashes every layer.
func (b *builder) finish(ctx context.Context, ss *stageState, name, tag, kind string, flatten bool) (*api.BuildResult, error) {
	s := b.s
	l := store.Layer{Tenant: b.tenant, Name: name, Tag: tag, Kind: kind, CreatedAt: time.Now().UTC()}
	if flatten {
		sb, n, err := b.sandbox(ctx, ss)
		if err != nil {
			return nil, err
		}
		done := s.layerWriter()
		res, err := n.client.Snapshot(ctx, sb.API.ID, edge.SnapshotRequest{Merge: len(sb.LayerDigests)})
		if err != nil {
			done()
			return nil, fmt.Errorf("flatten the build: %w", err)
		}
		l.Digest, l.Size = res.Digest, res.Size
		err = s.store.PutLayer(ctx, l)
		done()
		if err != nil {
			return nil, err
		}
	} else {
		top, err := s.store.LayerByDigest(ctx, b.tenant, ss.stack[len(ss.stack)-1])
		if err != nil {
			return nil, err
		}
		l.Digest, l.Size, l.Parents = top.Digest, top.Size, append([]string(nil), ss.stack[:len(ss.stack)-1]...)
		if err := s.store.PutLayer(ctx, l); err != nil {
			return nil, err
		}
	}
	s.layers.forget()
	cfg := ss.config
	cfg.Env = ss.env.Map()
	if err := s.putLayerConfig(ctx, l, cfg); err != nil {
		return nil, err
	}
	return &api.BuildResult{Layer: layerAPI(l), Config: &cfg}, nil
}

// Layer configs live in the layer store beside the layers, keyed by the
// record (tenant, name, tag) and its digest: two builds may end on the
// same layer with different configs.
func layerConfigKey(l store.Layer) string {
	return "layer-config/" + hashOf(l.Tenant, l.Name, l.Tag, l.Digest)
}

func (s *Server) putLayerConfig(ctx context.Context, l store.Layer, cfg api.LayerConfig) error {
	if s.cfg.Layers == nil {
		return nil
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	s.configs.Delete(layerConfigKey(l))
	return s.cfg.Layers.Blobs().Put(ctx, layerConfigKey(l), bytes.NewReader(b), int64(len(b)))
}

// configCache maps a layer config key to its *api.LayerConfig (nil: none).
type configCache = sync.Map

// layerConfig reads the config a build kept beside l, if any.
func (s *Server) layerConfig(ctx context.Context, l store.Layer) (*api.LayerConfig, error) {
	key := layerConfigKey(l)
	if v, ok := s.configs.Load(key); ok {
		return v.(*api.LayerConfig), nil
	}
	if s.cfg.Layers == nil {
		return nil, nil
	}
	raw, err := blob.ReadAll(ctx, s.cfg.Layers.Blobs(), key)
	var cfg *api.LayerConfig
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		cfg = &api.LayerConfig{}
		if err := json.Unmarshal(raw, cfg); err != nil {
			return nil, fmt.Errorf("config of layer %s:%s: %w", l.Name, l.Tag, err)
		}
	}
	s.configs.Store(key, cfg)
	return cfg, nil
}

// applyLayerConfig gives a create the defaults of its top layer's config:
// its env under the create's own, and its workdir.
func (s *Server) applyLayerConfig(ctx context.Context, req *api.CreateSandboxRequest, top store.Layer) error {
	cfg, err := s.layerConfig(ctx, top)
	if err != nil || cfg == nil {
		return err
	}
	if len(cfg.Env) == 0 && cfg.Workdir == "" {
		return nil
	}
	env := map[string]string{}
	for k, v := range cfg.Env {
		env[k] = v
	}
	if cfg.Workdir != "" {
		env[EnvWorkdir] = cfg.Workdir
	}
	for k, v := range req.Env {
		env[k] = v
	}
	req.Env = env
	return nil
}
