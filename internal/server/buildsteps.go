package server

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/dockerfile"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/policy"
	"github.com/dsec-project/dsec/internal/store"
)

// step runs one instruction of stage i.
func (b *builder) step(ctx context.Context, stage int, ss *stageState, in dockerfile.Instruction) error {
	b.index++
	ev := api.BuildStep{Index: b.index, Total: b.total, Stage: stage, Line: in.Line, Instruction: in.Original}
	b.emit(api.BuildEvent{Step: &ev})
	start := time.Now()
	cached, err := b.apply(ctx, ss, in)
	if err != nil {
		var se *stepError
		if !errors.As(err, &se) {
			err = &stepError{line: in.Line, err: err}
		}
		return err
	}
	if cached {
		b.cached++
	}
	ev.Done, ev.Cached, ev.DurationMs = true, cached, time.Since(start).Milliseconds()
	b.emit(api.BuildEvent{Step: &ev})
	return nil
}

// vars is what expansion sees in a stage: its args, then its env.
func (ss *stageState) vars() *dockerfile.Env {
	v := ss.args.Clone()
	for k, val := range ss.env.Map() {
		v.Set(k, val)
	}
	return v
}

func (b *builder) expand(ss *stageState, in dockerfile.Instruction, words []string) ([]string, error) {
	out := make([]string, len(words))
	for i, w := range words {
		v, err := dockerfile.Expand(in.Line, w, ss.vars())
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// apply changes ss by in; it reports whether the step came from the cache.
func (b *builder) apply(ctx context.Context, ss *stageState, in dockerfile.Instruction) (bool, error) {
	switch in.Cmd {
	case "env", "label":
		kv, err := b.expand(ss, in, in.Args)
		if err != nil {
			return false, err
		}
		for i := 0; i < len(kv); i += 2 {
			if in.Cmd == "env" {
				ss.env.Set(kv[i], kv[i+1])
				continue
			}
			if ss.config.Labels == nil {
				ss.config.Labels = map[string]string{}
			}
			ss.config.Labels[kv[i]] = kv[i+1]
		}
		ss.config.Env = ss.env.Map()
	case "arg":
		for _, a := range in.Args {
			k, v, hasDefault := strings.Cut(a, "=")
			if _, given := ss.args.Get(k); given && !hasDefault {
				continue
			}
			if given, ok := ss.args.Get(k); ok && hasDefault {
				v = given // a build arg wins over the default
			}
			ev, err := dockerfile.Expand(in.Line, v, ss.vars())
			if err != nil {
				return false, err
			}
			ss.args.Set(k, ev)
		}
	case "workdir":
		w, err := b.expand(ss, in, in.Args[:1])
		if err != nil {
			return false, err
		}
		ss.config.Workdir = path.Join("/", ss.config.Workdir, w[0])
		if strings.HasPrefix(w[0], "/") {
			ss.config.Workdir = path.Clean(w[0])
		}
	case "user":
		u, err := b.expand(ss, in, in.Args[:1])
		if err != nil {
			return false, err
		}
		ss.config.User = u[0]
	case "entrypoint", "cmd":
		argv := in.Args
		if !in.JSON {
			argv = []string{"/bin/sh", "-c", in.Args[0]}
		}
		if in.Cmd == "cmd" {
			ss.config.Cmd = argv
		} else {
			ss.config.Entrypoint = argv
		}
	case "expose", "maintainer", "stopsignal":
	case "run":
		return b.runStep(ctx, ss, in)
	case "copy", "add":
		return b.copyStep(ctx, ss, in)
	default:
		return false, errdefs.Invalid("%s is not supported", strings.ToUpper(in.Cmd))
	}
	return false, nil
}

// fsStep is a step that changes files: from the cache under key, or done
// by do in a build sandbox of the stage and packed.
func (b *builder) fsStep(ctx context.Context, ss *stageState, key string,
	do func(sb store.Sandbox, n *node) error) (bool, error) {
	name := buildCachePrefix + key[:40]
	if l, err := b.s.store.GetLayer(ctx, b.tenant, name, "1"); err == nil {
		if l.Tenant == b.tenant {
			// A hit renews the cache layer: the collector keeps a step's
			// layer for BuildCacheTTL after its last use.
			l.CreatedAt = time.Now().UTC()
			if err := b.s.store.PutLayer(ctx, l); err != nil {
				return false, err
			}
		}
		ss.stack, ss.key = append(append([]string(nil), l.Parents...), l.Digest), key
		return true, nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return false, err
	}
	sb, n, err := b.sandbox(ctx, ss)
	if err != nil {
		return false, err
	}
	if err := do(*sb, n); err != nil {
		ss.sb = nil // its state is no step's
		return false, err
	}
	l, err := b.s.pack(ctx, *sb, n, name, "1")
	if err != nil {
		ss.sb = nil
		return false, err
	}
	b.ran++
	ss.stack, ss.key, ss.stepKey = append(append([]string(nil), l.Parents...), l.Digest), key, key
	return false, nil
}

// labelBuild marks a build's sandboxes: the build's id.
const labelBuild = "dsec.build"

// sandbox returns a build sandbox holding the stage's state now: the one
// the stage's last step ran in, or a new one of its stack.
func (b *builder) sandbox(ctx context.Context, ss *stageState) (*store.Sandbox, *node, error) {
	if ss.sb != nil && ss.stepKey == ss.key {
		return ss.sb, ss.sbNode, nil
	}
	req := api.CreateSandboxRequest{Backend: api.BackendContainer, Layers: &api.LayerRefs{},
		Network: &api.Network{Mode: b.network}, Labels: map[string]string{labelBuild: b.id}}
	if err := b.s.fillResources(&req.Resources); err != nil {
		return nil, nil, err
	}
	if err := policy.CheckNetwork(req.Network); err != nil {
		return nil, nil, err
	}
	sb, err := b.s.create(ctx, b.tenant, plan{req: req, digests: ss.stack})
	if err != nil {
		return nil, nil, fmt.Errorf("start a build sandbox: %w", err)
	}
	b.mu.Lock()
	b.boxes = append(b.boxes, sb)
	b.mu.Unlock()
	n, err := b.s.nodes.get(sb.API.Node)
	if err != nil {
		return nil, nil, err
	}
	ss.sb, ss.sbNode, ss.stepKey = &sb, n, ss.key
	return ss.sb, n, nil
}

// execIn runs argv in a build sandbox under the stage's config.
func (b *builder) execIn(ctx context.Context, ss *stageState, sb store.Sandbox, n *node, argv []string,
	stdin []byte, line int, live bool) (*api.ExecResult, error) {
	maxOut := int64(1 << 20)
	if !live {
		maxOut = maxCopyBytes // a tar of COPY --from
	}
	req := &api.ExecRequest{Cmd: argv, Env: ss.env.Map(), TimeoutMs: 30 * 60 * 1000, MaxOutputBytes: maxOut}
	if stdin != nil {
		req.Stdin, req.StdinEncoding = base64.StdEncoding.EncodeToString(stdin), "base64"
	}
	var emit func(api.ExecEvent)
	if live {
		emit = func(ev api.ExecEvent) {
			for stream, p := range map[string]*string{"stdout": ev.Stdout, "stderr": ev.Stderr} {
				if p == nil || *p == "" {
					continue
				}
				data := *p
				if ev.Encoding == "base64" {
					if raw, err := base64.StdEncoding.DecodeString(data); err == nil {
						data = strings.ToValidUTF8(string(raw), "\uFFFD")
					}
				}
				b.emit(api.BuildEvent{Output: &api.BuildOutput{Line: line, Stream: stream, Data: data}})
			}
		}
	}
	res, _, err := b.s.startAndCollect(ctx, n, sb.API.ID, req, "build-"+b.id, emit)
	return res, err
}

func (b *builder) runStep(ctx context.Context, ss *stageState, in dockerfile.Instruction) (bool, error) {
	argv := in.Args
	if !in.JSON {
		argv = []string{"/bin/sh", "-c", in.Args[0]}
	}
	wd := ss.config.Workdir
	if wd == "" {
		wd = "/"
	}
	// The workdir is made if missing, as docker does; USER runs the
	// command through su (the user must be in the image's passwd).
	wrapped := append([]string{"/bin/sh", "-c", `mkdir -p "$0" && cd "$0" && exec "$@"`, wd}, argv...)
	if u := ss.config.User; u != "" && u != "root" && u != "0" {
		wrapped = []string{"/bin/sh", "-c", `mkdir -p "$0" && cd "$0" && exec su -s /bin/sh "$1" -c "$2"`, wd, u,
			shellJoin(argv)}
	}
	cfg, _ := json.Marshal(struct {
		Env map[string]string
		Net string
	}{ss.env.Map(), b.network})
	key := hashOf(ss.key, "run", strings.Join(wrapped, "\x00"), string(cfg))
	return b.fsStep(ctx, ss, key, func(sb store.Sandbox, n *node) error {
		res, err := b.execIn(ctx, ss, sb, n, wrapped, nil, in.Line, true)
		if err != nil {
			return err
		}
		if res.ExitCode != 0 || res.TimedOut {
			exit := res.ExitCode
			out := res.Stdout + res.Stderr
			if res.Encoding == "base64" {
				o, _ := base64.StdEncoding.DecodeString(res.Stdout)
				e, _ := base64.StdEncoding.DecodeString(res.Stderr)
				out = strings.ToValidUTF8(string(o)+string(e), "\uFFFD")
			}
			if len(out) > 4096 {
				out = out[len(out)-4096:]
			}
			return &stepError{line: in.Line, exit: &exit, output: out,
				err: fmt.Errorf("RUN exited %d: %w", exit, errdefs.ErrFailedPrecondition)}
		}
		return nil
	})
}

// shellJoin quotes argv for sh -c.
func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// copyStep builds the tar of what a COPY or ADD brings, at its
// destination, and extracts it in the stage's build sandbox.
func (b *builder) copyStep(ctx context.Context, ss *stageState, in dockerfile.Instruction) (bool, error) {
	words, err := b.expand(ss, in, in.Args)
	if err != nil {
		return false, err
	}
	srcs, dest := words[:len(words)-1], words[len(words)-1]
	if !path.IsAbs(dest) {
		dest = path.Join("/", ss.config.Workdir, dest) + map[bool]string{true: "/"}[strings.HasSuffix(dest, "/")]
	}
	intoDir := strings.HasSuffix(dest, "/") || len(srcs) > 1
	own := func(h *tar.Header) {}
	if c := in.Flags["chown"]; c != "" {
		u, g, _ := strings.Cut(c, ":")
		if g == "" {
			g = u
		}
		uid, err1 := strconv.Atoi(u)
		gid, err2 := strconv.Atoi(g)
		if err1 != nil || err2 != nil || uid < 0 || gid < 0 {
			return false, errdefs.Invalid("--chown=%s: give numeric UID[:GID]", c)
		}
		own = func(h *tar.Header) { h.Uid, h.Gid, h.Uname, h.Gname = uid, gid, "", "" }
	}
	if m := in.Flags["chmod"]; m != "" {
		mode, err := strconv.ParseUint(m, 8, 32)
		if err != nil || mode > 0o7777 {
			return false, errdefs.Invalid("--chmod=%s: give an octal mode", m)
		}
		prev := own
		own = func(h *tar.Header) { prev(h); h.Mode = int64(mode) }
	}
	var src []tarEntry
	if from := in.Flags["from"]; from != "" {
		if src, err = b.fromStage(ctx, from, srcs, in.Line); err != nil {
			return false, err
		}
	} else if src, err = b.fromContext(srcs); err != nil {
		return false, err
	}
	if len(src) == 0 {
		return false, errdefs.Invalid("COPY %s: no such file in the source", strings.Join(srcs, " "))
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range src {
		h := *e.hdr
		target := path.Join(dest, e.rel)
		if !intoDir && e.single {
			target = path.Clean(dest)
		}
		h.Name = strings.TrimPrefix(target, "/")
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		own(&h)
		if err := tw.WriteHeader(&h); err != nil {
			return false, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return false, err
		}
		if buf.Len() > maxCopyBytes {
			return false, fmt.Errorf("COPY brings over %d MiB: %w", maxCopyBytes>>20, errdefs.ErrTooLarge)
		}
	}
	if err := tw.Close(); err != nil {
		return false, err
	}
	key := hashOf(ss.key, "copy", hashOf(buf.String()))
	return b.fsStep(ctx, ss, key, func(sb store.Sandbox, n *node) error {
		res, err := b.execIn(ctx, ss, sb, n, []string{"tar", "-x", "-p", "-f", "-", "-C", "/"}, buf.Bytes(), in.Line, false)
		if err != nil {
			return err
		}
		if res.ExitCode != 0 {
			return &stepError{line: in.Line, output: res.Stderr,
				err: fmt.Errorf("extract the copied files (the image needs tar): exit %d: %w", res.ExitCode, errdefs.ErrFailedPrecondition)}
		}
		return nil
	})
}

// tarEntry is a file a COPY brings: rel is its path under the
// destination directory; single marks a source that is one file.
type tarEntry struct {
	hdr    *tar.Header
	data   []byte
	rel    string
	single bool
}

// fromContext picks the COPY sources out of the build context: a file, a
// directory's contents, or what a glob matches.
func (b *builder) fromContext(srcs []string) ([]tarEntry, error) {
	var out []tarEntry
	for _, s := range srcs {
		p, err := contextPath(s)
		if err != nil {
			return nil, err
		}
		var roots []string
		if strings.ContainsAny(p, "*?[") {
			for _, e := range b.ctxTar.order {
				if ok, _ := path.Match(p, e); ok {
					roots = append(roots, e)
				}
			}
		} else {
			roots = []string{p}
		}
		for _, root := range roots {
			for _, name := range b.ctxTar.order {
				e := b.ctxTar.entries[name]
				var rel string
				switch {
				case root == "." && name != ".":
					rel = name
				case name == root && e.hdr.Typeflag != tar.TypeDir:
					rel = path.Base(name)
				case strings.HasPrefix(name, root+"/"):
					rel = strings.TrimPrefix(name, root+"/")
				default:
					continue
				}
				h := *e.hdr
				h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", "" // owned by root unless --chown
				te := tarEntry{hdr: &h, rel: rel, single: name == root && len(roots) == 1 && len(srcs) == 1}
				if e.hdr.Typeflag == tar.TypeReg {
					te.data = make([]byte, e.hdr.Size)
					if _, err := b.ctxTar.f.ReadAt(te.data, e.off); err != nil {
						return nil, fmt.Errorf("read %s from the build context: %w", name, err)
					}
				}
				out = append(out, te)
			}
		}
	}
	return out, nil
}

// fromStage tars the sources in a build sandbox of an earlier stage.
func (b *builder) fromStage(ctx context.Context, ref string, srcs []string, line int) ([]tarEntry, error) {
	src := b.stage(ref)
	if src == nil {
		return nil, errdefs.Invalid("COPY --from=%s: no earlier stage of that name", ref)
	}
	sb, n, err := b.sandbox(ctx, src)
	if err != nil {
		return nil, err
	}
	var out []tarEntry
	for _, s := range srcs {
		p := path.Clean("/" + s)
		dir, base := path.Dir(p), path.Base(p)
		if p == "/" {
			dir, base = "/", "."
		}
		res, err := b.execIn(ctx, src, *sb, n, []string{"tar", "-c", "-f", "-", "-C", dir, base}, nil, line, false)
		if err != nil {
			return nil, err
		}
		if res.ExitCode != 0 {
			return nil, &stepError{line: line, output: res.Stderr,
				err: fmt.Errorf("COPY --from=%s %s: exit %d: %w", ref, s, res.ExitCode, errdefs.ErrFailedPrecondition)}
		}
		raw := []byte(res.Stdout)
		if res.Encoding == "base64" {
			if raw, err = base64.StdEncoding.DecodeString(res.Stdout); err != nil {
				return nil, err
			}
		}
		if res.Truncated {
			return nil, fmt.Errorf("COPY --from=%s %s: over the output limit: %w", ref, s, errdefs.ErrTooLarge)
		}
		tr := tar.NewReader(bytes.NewReader(raw))
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("COPY --from=%s: read the tar: %w", ref, err)
			}
			name := path.Clean(h.Name)
			te := tarEntry{hdr: h}
			switch {
			case name == base && h.Typeflag != tar.TypeDir:
				te.rel, te.single = path.Base(name), len(srcs) == 1
			case name == base || name == ".":
				continue
			case base == ".":
				te.rel = name
			default:
				te.rel = strings.TrimPrefix(name, base+"/")
			}
			if h.Typeflag == tar.TypeReg {
				if te.data, err = io.ReadAll(tr); err != nil {
					return nil, err
				}
			}
			out = append(out, te)
		}
	}
	return out, nil
}
