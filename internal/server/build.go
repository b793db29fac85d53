package server

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/dockerfile"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// Dockerfile builds (POST /v1/layers:build). The body is the build
// context as a tar holding the Dockerfile. Each stage starts from a dsec
// layer; RUN runs in a build sandbox (a container of the stage's stack,
// reused by the stage's next steps), COPY and ADD pipe a tar into it (from
// the context, or out of another stage's sandbox), and after every such
// step the sandbox is packed (pack_diff) into a layer. That layer is
// recorded as build-cache/<key>:1, key hashing the previous step's key,
// the instruction as expanded, the config it runs under and the content
// of the files it copies: a rebuild finds every unchanged step there and
// runs from the first changed one. ENV, WORKDIR, USER, ARG, LABEL, CMD and
// ENTRYPOINT change the config only; the final config is kept beside the
// result layer (see layerConfig) and sandboxes created from it get its
// env and workdir.

// buildCachePrefix names the layers of cached build steps.
const buildCachePrefix = "build-cache/"

// maxCopyBytes bounds what one COPY moves: it rides an exec's stdin.
const maxCopyBytes = 48 << 20

type builder struct {
	s       *Server
	tenant  string
	id      string
	network string
	ctxTar  *buildContext
	emit    func(api.BuildEvent)

	stages       []*stageState
	mu           sync.Mutex
	boxes        []store.Sandbox // every build sandbox, destroyed at the end
	total, index int
	cached, ran  int
}

// stageState is a stage as built so far.
type stageState struct {
	name    string
	stack   []string // digests, base first
	key     string
	env     *dockerfile.Env
	args    *dockerfile.Env
	config  api.LayerConfig
	sb      *store.Sandbox // a build sandbox holding exactly stack, or nil
	sbNode  *node
	stepKey string // the key sb's state has
}

func (s *Server) buildLayer(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	tenant := principalFrom(r.Context()).Tenant
	name, tag, err := ParseRef(q.Get("name"))
	if err != nil {
		return err
	}
	if strings.HasPrefix(name, checkpointPrefix) || strings.HasPrefix(name, buildCachePrefix) || strings.HasPrefix(name, forkLayerPrefix) {
		return errdefs.Invalid("layer names %s…, %s… and %s… are kept for dsec", checkpointPrefix, buildCachePrefix, forkLayerPrefix)
	}
	flatten, err := queryBool(q, "flatten")
	if err != nil {
		return err
	}
	kind := q.Get("kind")
	switch {
	case kind == "" && flatten:
		kind = api.KindBase
	case kind == "" || kind == api.KindSnapshot && !flatten:
		kind = api.KindSnapshot
	case !flatten:
		return errdefs.Invalid("kind %s needs flatten=true: a layer kept as a stack is a snapshot", kind)
	case kind != api.KindBase && kind != api.KindWorkspace && kind != api.KindToolkit:
		return errdefs.Invalid("kind must be base, workspace or toolkit, not %q", kind)
	}
	network := q.Get("network")
	switch network {
	case "":
		network = api.NetworkNone
	case api.NetworkNone, api.NetworkOpen:
	default:
		return errdefs.Invalid("network must be none or open, not %q", network)
	}
	bctx, err := readBuildContext(http.MaxBytesReader(w, r.Body, s.cfg.MaxLayerBytes), s.cfg.TmpDir)
	if err != nil {
		return err
	}
	defer bctx.close()
	dfName := q.Get("dockerfile")
	if dfName == "" {
		dfName = "Dockerfile"
	}
	df, err := bctx.open(dfName)
	if err != nil {
		return errdefs.Invalid("the context holds no Dockerfile at %s", dfName)
	}
	f, err := dockerfile.Parse(df)
	if err != nil {
		return err
	}
	b := &builder{s: s, tenant: tenant, id: "bd-" + randomID(10), network: network, ctxTar: bctx}
	global := &dockerfile.Env{}
	for _, a := range q["arg"] {
		k, v, ok := strings.Cut(a, "=")
		if !ok || !envKeyRE.MatchString(k) {
			return errdefs.Invalid("build arg %q: want KEY=VALUE", a)
		}
		global.Set(k, v)
	}
	if err := b.check(f, global); err != nil {
		return err
	}

	// From here on the answer is a stream of events.
	var wmu sync.Mutex
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	b.emit = func(ev api.BuildEvent) {
		wmu.Lock()
		defer wmu.Unlock()
		if r.Context().Err() == nil && enc.Encode(ev) == nil {
			rc.Flush()
		}
	}
	ctx := context.WithoutCancel(r.Context())
	start := time.Now()
	res, err := b.run(ctx, r.Context(), f, global, name, tag, kind, flatten)
	b.cleanup(ctx)
	if err != nil {
		be := &api.BuildError{Code: errdefs.Code(err), Message: err.Error()}
		var se *stepError
		if errors.As(err, &se) {
			be.Line, be.ExitCode, be.Output = se.line, se.exit, se.output
		}
		var de *dockerfile.Error
		if errors.As(err, &de) {
			be.Line = de.Line
		}
		s.log.InfoContext(ctx, "layer build failed", "tenant", tenant, "build", b.id, "err", err)
		b.emit(api.BuildEvent{Error: be})
		return nil
	}
	res.Steps, res.CachedSteps, res.DurationMs = b.total, b.cached, time.Since(start).Milliseconds()
	s.log.InfoContext(ctx, "layer built", "tenant", tenant, "build", b.id, "layer", name+":"+tag, "steps", b.total,
		"cached", b.cached, "duration", time.Since(start))
	b.emit(api.BuildEvent{Result: res})
	return nil
}

// stepError is a step that failed, at a Dockerfile line.
type stepError struct {
	line   int
	exit   *int
	output string
	err    error
}

func (e *stepError) Error() string { return fmt.Sprintf("Dockerfile line %d: %v", e.line, e.err) }
func (e *stepError) Unwrap() error { return e.err }

// check runs the checks that need no sandbox, so that a bad Dockerfile
// is a 4xx before anything is built: FROM refs resolve, COPY --from names
// an earlier stage, and no COPY source leaves the context.
func (b *builder) check(f *dockerfile.File, global *dockerfile.Env) error {
	names := map[string]int{}
	for i, st := range f.Stages {
		from, err := dockerfile.Expand(st.Line, st.From, global)
		if err != nil {
			return err
		}
		if _, ok := names[strings.ToLower(from)]; !ok {
			if _, err := b.fromStack(context.Background(), from); err != nil {
				return &dockerfile.Error{Line: st.Line, Msg: err.Error()}
			}
		}
		for _, in := range st.Steps {
			b.total++
			if in.Cmd != "copy" && in.Cmd != "add" {
				continue
			}
			if from := in.Flags["from"]; from != "" {
				if _, ok := names[strings.ToLower(from)]; !ok {
					return &dockerfile.Error{Line: in.Line, Msg: fmt.Sprintf("COPY --from=%s: no earlier stage of that name", from)}
				}
				continue
			}
			for _, src := range in.Args[:len(in.Args)-1] {
				if strings.Contains(src, "://") {
					return &dockerfile.Error{Line: in.Line, Msg: "sources from URLs are not supported"}
				}
				if _, err := contextPath(src); err != nil {
					return &dockerfile.Error{Line: in.Line, Msg: err.Error()}
				}
			}
		}
		if st.Name != "" {
			names[st.Name] = i
		}
		names[fmt.Sprint(i)] = i
	}
	return nil
}

// contextPath cleans a COPY source, refusing one outside the context.
func contextPath(src string) (string, error) {
	p := path.Clean("/" + src)
	rel := strings.TrimPrefix(p, "/")
	if strings.HasPrefix(path.Clean(src), "..") || strings.HasPrefix(path.Clean(src), "/..") {
		return "", fmt.Errorf("COPY source %s is outside the build context", src)
	}
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

// fromStack resolves a FROM ref to the stack it starts from.
func (b *builder) fromStack(ctx context.Context, ref string) ([]string, error) {
	if ref == "scratch" {
		return nil, errdefs.Invalid("FROM scratch is not supported: start from a dsec layer (e.g. base:minimal)")
	}
	if strings.Contains(ref, "://") || strings.HasPrefix(ref, "oci:") || strings.HasPrefix(ref, "docker-archive:") {
		return nil, errdefs.Invalid("FROM %s: import the image first (dsec layer import --image %s --name NAME:TAG) and use its ref", ref, ref)
	}
	l, err := b.s.resolveLayer(ctx, b.tenant, ref)
	if err != nil {
		return nil, err
	}
	if l.Kind == api.KindSnapshot {
		return append(append([]string(nil), l.Parents...), l.Digest), nil
	}
	return []string{l.Digest}, nil
}

// run builds every stage and records the last one's result.
func (b *builder) run(ctx, client context.Context, f *dockerfile.File, global *dockerfile.Env,
	name, tag, kind string, flatten bool) (*api.BuildResult, error) {
	for i, st := range f.Stages {
		from, err := dockerfile.Expand(st.Line, st.From, global)
		if err != nil {
			return nil, err
		}
		ss := &stageState{name: st.Name, env: &dockerfile.Env{}, args: global.Clone()}
		if src := b.stage(from); src != nil {
			ss.stack, ss.key, ss.config = src.stack, src.key, src.config
			ss.env = src.env.Clone()
		} else if ss.stack, err = b.fromStack(ctx, from); err != nil {
			return nil, &stepError{line: st.Line, err: err}
		}
		if ss.key == "" {
			ss.key = hashOf("from", strings.Join(ss.stack, ","))
		}
		b.stages = append(b.stages, ss)
		for _, in := range st.Steps {
			if client.Err() != nil {
				return nil, fmt.Errorf("the client left: %w", errdefs.ErrUnavailable)
			}
			if err := b.step(ctx, i, ss, in); err != nil {
				return nil, err
			}
		}
	}
	last := b.stages[len(b.stages)-1]
	return b.finish(ctx, last, name, tag, kind, flatten)
}

// stage finds an earlier stage by name or index.
func (b *builder) stage(ref string) *stageState {
	for i, st := range b.stages {
		if (st.name != "" && st.name == strings.ToLower(ref)) || fmt.Sprint(i) == ref {
			return st
		}
	}
	return nil
}

func hashOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// cleanup destroys the build sandboxes.
func (b *builder) cleanup(ctx context.Context) {
	b.mu.Lock()
	boxes := b.boxes
	b.boxes = nil
	b.mu.Unlock()
	for _, sb := range boxes {
		if err := b.s.destroy(ctx, sb); err != nil {
			b.s.log.WarnContext(ctx, "build: destroy a build sandbox", "build", b.id, "sandbox", sb.API.ID, "err", err)
		}
	}
}

// buildContext is an uploaded build context: a tar kept in a temporary
// file, indexed by cleaned path.
type buildContext struct {
	f       *os.File
	entries map[string]ctxEntry
	order   []string
}

type ctxEntry struct {
	hdr *tar.Header
	off int64
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += int64(k)
	return k, err
}

func readBuildContext(body io.Reader, tmpDir string) (*buildContext, error) {
	f, err := os.CreateTemp(tmpDir, "build-context-")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name()) // gone when closed
	bc := &buildContext{f: f, entries: map[string]ctxEntry{}}
	if _, err := io.Copy(f, body); err != nil {
		bc.close()
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, fmt.Errorf("build context over %d bytes: %w", mbe.Limit, errdefs.ErrTooLarge)
		}
		return nil, errdefs.Invalid("read the build context: %v", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		bc.close()
		return nil, err
	}
	cr := &countingReader{r: f}
	tr := tar.NewReader(cr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			bc.close()
			return nil, errdefs.Invalid("the build context is not a tar: %v", err)
		}
		p, err := contextPath(h.Name)
		if err != nil || p == "." {
			continue
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
		default:
			continue
		}
		if _, ok := bc.entries[p]; !ok {
			bc.order = append(bc.order, p)
		}
		bc.entries[p] = ctxEntry{hdr: h, off: cr.n}
	}
	return bc, nil
}

func (bc *buildContext) close() { bc.f.Close() }

func (bc *buildContext) open(p string) (io.Reader, error) {
	rel, err := contextPath(p)
	if err != nil {
		return nil, err
	}
	e, ok := bc.entries[rel]
	if !ok || e.hdr.Typeflag != tar.TypeReg {
		return nil, errdefs.NotFound("%s in the build context", p)
	}
	return io.NewSectionReader(bc.f, e.off, e.hdr.Size), nil
}
