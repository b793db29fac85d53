package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/store"
)

var (
	layerNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]{0,127}$`)
	layerTagRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// ParseRef splits "name:tag" ("latest" when the tag is left out) and
// validates both.
func ParseRef(ref string) (name, tag string, err error) {
	name, tag, ok := strings.Cut(ref, ":")
	if !ok {
		tag = "latest"
	}
	if !layerNameRE.MatchString(name) || !layerTagRE.MatchString(tag) {
		return "", "", errdefs.Invalid("bad layer name %q: want name:tag, name of [a-z0-9._/-], tag of [A-Za-z0-9_.-]", ref)
	}
	return name, tag, nil
}

// resolveLayer finds a layer the tenant may use by "name:tag" or
// "sha256:<digest>".
func (s *Server) resolveLayer(ctx context.Context, tenant, ref string) (store.Layer, error) {
	if strings.HasPrefix(ref, "sha256:") {
		if _, err := contentdigest.Parse(ref); err != nil {
			return store.Layer{}, err
		}
		return s.store.LayerByDigest(ctx, tenant, ref)
	}
	name, tag, err := ParseRef(ref)
	if err != nil {
		return store.Layer{}, err
	}
	return s.store.GetLayer(ctx, tenant, name, tag)
}

func layerAPI(l store.Layer) api.Layer {
	return api.Layer{
		Ref: l.Name + ":" + l.Tag, Name: l.Name, Tag: l.Tag, Digest: l.Digest, Kind: l.Kind,
		Size: l.Size, Public: l.Public, CreatedAt: l.CreatedAt, Parents: l.Parents,
	}
}

// createLayer takes a tar stream (plain or gzip) or a ready EROFS image and
// records it as a layer of the caller's tenant.
func (s *Server) createLayer(w http.ResponseWriter, r *http.Request) error {
	p := principalFrom(r.Context())
	q := r.URL.Query()
	kind := q.Get("kind")
	switch kind {
	case api.KindBase, api.KindWorkspace, api.KindToolkit, api.KindVM:
	default:
		return errdefs.Invalid("kind must be base, workspace, toolkit or vm, not %q", kind)
	}
	name, tag, err := ParseRef(q.Get("name"))
	if err != nil {
		return err
	}
	if strings.HasPrefix(name, checkpointPrefix) {
		return errdefs.Invalid("layer names %s… are kept for trajectory checkpoints", checkpointPrefix)
	}
	public, err := queryBool(q, "public")
	if err != nil {
		return err
	}
	if public && !p.Admin {
		return fmt.Errorf("only an admin can publish a public layer: %w", errdefs.ErrPermissionDenied)
	}
	defer s.layerWriter()()
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxLayerBytes)
	var d layer.Desc
	if kind == api.KindVM {
		// A vm layer is a disk image (qcow2 or raw), stored as it is.
		d, err = s.cfg.Layers.ImportDisk(r.Context(), body, s.cfg.MaxLayerBytes)
	} else {
		d, err = s.importLayer(r.Context(), body)
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("layer upload over %d bytes: %w", s.cfg.MaxLayerBytes, errdefs.ErrTooLarge)
		}
		return err
	}
	l := store.Layer{
		Tenant: p.Tenant, Name: name, Tag: tag, Digest: d.Digest, Kind: kind, Size: d.Size,
		Public: public, CreatedAt: time.Now().UTC(),
	}
	defer s.layers.forget()
	if err := s.store.PutLayer(r.Context(), l); err != nil {
		return err
	}
	s.log.InfoContext(r.Context(), "layer stored", "tenant", p.Tenant, "layer", name+":"+tag, "digest", d.Digest, "size", d.Size,
		"chunks", d.Chunks, "new_chunks", d.NewChunks, "stored_bytes", d.StoredBytes)
	httpapi.WriteJSON(w, http.StatusCreated, layerAPI(l))
	return nil
}

// importLayer stores an upload: an EROFS image as a whole-image layer,
// anything else as a tar stream to unpack and build into a chunked layer.
func (s *Server) importLayer(ctx context.Context, body io.Reader) (layer.Desc, error) {
	br := bufio.NewReaderSize(body, 64<<10)
	head, err := br.Peek(4096)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return layer.Desc{}, err
	}
	if len(head) == 0 {
		return layer.Desc{}, errdefs.Invalid("empty layer upload: send a tar stream or an EROFS image")
	}
	if layer.IsEROFS(bytes.NewReader(head)) {
		return s.cfg.Layers.ImportImage(ctx, br, s.cfg.MaxLayerBytes)
	}
	return layer.FromTar(ctx, br, s.cfg.Layers, s.cfg.TmpDir, layer.Limits{})
}

func (s *Server) listLayers(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.store.ListLayers(r.Context(), principalFrom(r.Context()).Tenant)
	if err != nil {
		return err
	}
	out := api.LayerList{Layers: make([]api.Layer, 0, len(ls))}
	for _, l := range ls {
		out.Layers = append(out.Layers, layerAPI(l))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// EnsureDefaultBase makes the public base layer "base:minimal" from a
// static busybox if it does not exist yet.
func (s *Server) EnsureDefaultBase(ctx context.Context, busybox string) error {
	if _, err := s.store.GetLayer(ctx, AdminTenant, "base", "minimal"); err == nil {
		return nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	dir, err := os.MkdirTemp(s.cfg.TmpDir, "base-minimal-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := layer.MinimalBase(ctx, busybox, dir); err != nil {
		return fmt.Errorf("default base: %w", err)
	}
	defer s.layerWriter()()
	img, err := s.cfg.Layers.Build(ctx, dir)
	if err != nil {
		return fmt.Errorf("default base: %w", err)
	}
	s.log.InfoContext(ctx, "created default base layer base:minimal", "digest", img.Digest)
	defer s.layers.forget()
	return s.store.PutLayer(ctx, store.Layer{
		Tenant: AdminTenant, Name: "base", Tag: "minimal", Digest: img.Digest, Kind: api.KindBase,
		Size: img.Size, Public: true, CreatedAt: time.Now().UTC(),
	})
}
