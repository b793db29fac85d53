package e2b

import (
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/compat/e2b/envdpb/filesystem"
	"github.com/dsec-project/dsec/internal/errdefs"
)

func gzipReader(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) }

// fsService is filesystem.Filesystem on the agent's file API; MakeDir and
// Move run mkdir and mv in the sandbox. Watchers poll (see watchers).
type fsService struct{ h *Handler }

// Limits of a listing.
const (
	maxDepth   = 16
	maxEntries = 100_000
)

// listDir lists a directory through the agent.
func (h *Handler) listDir(ctx context.Context, id, dir string) ([]api.FileInfo, error) {
	var fl api.FileList
	if err := h.agentJSON(ctx, id, http.MethodGet, "/files", url.Values{"path": {dir}, "list": {"1"}}, nil, &fl); err != nil {
		return nil, err
	}
	return fl.Entries, nil
}

func entry(dir string, fi api.FileInfo) *filesystem.EntryInfo {
	p := path.Join(dir, fi.Name)
	e := &filesystem.EntryInfo{Name: fi.Name, Path: p, Size: fi.Size, Mode: fi.Mode,
		Permissions: fs.FileMode(fi.Mode & 0o777).String(), Owner: "root", Group: "root",
		ModifiedTime: timestamppb.New(fi.ModTime)}
	switch fi.Type {
	case "dir":
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		e.Mode |= uint32(fs.ModeDir)
		e.Permissions = (fs.ModeDir | fs.FileMode(fi.Mode&0o777)).String()
	case "symlink":
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		e.SymlinkTarget = proto.String(fi.Target)
		e.Permissions = (fs.ModeSymlink | fs.FileMode(fi.Mode&0o777)).String()
	default:
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	}
	return e
}

// stat finds a path's entry in its parent's listing.
func (h *Handler) stat(ctx context.Context, id, p string) (*filesystem.EntryInfo, error) {
	if p == "/" {
		return &filesystem.EntryInfo{Name: "/", Path: "/", Type: filesystem.FileType_FILE_TYPE_DIRECTORY,
			Mode: uint32(fs.ModeDir | 0o755), Permissions: (fs.ModeDir | 0o755).String(), Owner: "root", Group: "root"}, nil
	}
	dir, name := path.Split(p)
	dir = path.Clean(dir)
	entries, err := h.listDir(ctx, id, dir)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalid) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("path %s does not exist", p))
		}
		return nil, connectError(err)
	}
	for _, fi := range entries {
		if fi.Name == name {
			return entry(dir, fi), nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("path %s does not exist", p))
}

func reqPath(p string) (string, error) {
	a, err := absPath(p)
	if err != nil {
		return "", connectError(err)
	}
	return a, nil
}

func (s *fsService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	p, err := reqPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := s.h.stat(ctx, t.id, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

// run runs a command in the sandbox and turns a failure into an error of
// class class with its stderr.
func (h *Handler) run(ctx context.Context, id string, class error, argv ...string) error {
	var res api.ExecResult
	if err := h.agentJSON(ctx, id, http.MethodPost, "/exec", nil, &api.ExecRequest{Cmd: argv, TimeoutMs: 60_000}, &res); err != nil {
		return err
	}
	if res.ExitCode != 0 || res.Signal != "" {
		return fmt.Errorf("%s: %s: %w", argv[0], res.Stderr, class)
	}
	return nil
}

func (s *fsService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	p, err := reqPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if e, err := s.h.stat(ctx, t.id, p); err == nil {
		if e.Type == filesystem.FileType_FILE_TYPE_DIRECTORY {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s already exists and is not a directory", p))
	}
	if err := s.h.run(ctx, t.id, errdefs.ErrInvalid, "mkdir", "-p", "--", p); err != nil {
		return nil, connectError(err)
	}
	e, err := s.h.stat(ctx, t.id, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (s *fsService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	src, err := reqPath(req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := reqPath(req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if _, err := s.h.stat(ctx, t.id, src); err != nil {
		return nil, err
	}
	if err := s.h.run(ctx, t.id, errdefs.ErrInvalid, "mv", "-T", "--", src, dst); err != nil {
		return nil, connectError(err)
	}
	e, err := s.h.stat(ctx, t.id, dst)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

// walk lists dir down to depth levels (1: its entries only), calling fn
// for each entry.
func (h *Handler) walk(ctx context.Context, id, dir string, depth int, fn func(*filesystem.EntryInfo) error) error {
	entries, err := h.listDir(ctx, id, dir)
	if err != nil {
		return err
	}
	for _, fi := range entries {
		e := entry(dir, fi)
		if err := fn(e); err != nil {
			return err
		}
		if depth > 1 && e.Type == filesystem.FileType_FILE_TYPE_DIRECTORY {
			err := h.walk(ctx, id, e.Path, depth-1, fn)
			if err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrPermissionDenied) {
				return err
			}
		}
	}
	return nil
}

var errTooMany = fmt.Errorf("over %d entries: %w", maxEntries, errdefs.ErrResourceExhausted)

func (s *fsService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	p, err := reqPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	if depth > maxDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("depth %d is over %d", depth, maxDepth))
	}
	out := &filesystem.ListDirResponse{}
	err = s.h.walk(ctx, t.id, p, depth, func(e *filesystem.EntryInfo) error {
		if len(out.Entries) >= maxEntries {
			return errTooMany
		}
		out.Entries = append(out.Entries, e)
		return nil
	})
	if err != nil {
		if errors.Is(err, errdefs.ErrInvalid) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", p))
		}
		return nil, connectError(err)
	}
	return connect.NewResponse(out), nil
}

func (s *fsService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	p, err := reqPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := s.h.agentJSON(ctx, t.id, http.MethodDelete, "/files", url.Values{"path": {p}, "recursive": {"1"}}, nil, nil); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// Watchers poll: every pollEvery the watched tree is listed again and
// compared with the last listing (by type, size, mode and mtime), which
// yields CREATE, WRITE, CHMOD and REMOVE events; a rename shows as REMOVE
// + CREATE, and changes within one interval merge.
const (
	pollEvery   = 300 * time.Millisecond
	maxWatchers = 1024
	// maxSandboxWatchers keeps one sandbox from taking them all.
	maxSandboxWatchers = 64
	maxPending         = 10_000
	watcherIdle        = 10 * time.Minute
)

type snapshot map[string]*filesystem.EntryInfo // by path relative to the root

type watcher struct {
	sandbox   string
	root      string
	recursive bool
	withEntry bool

	mu   sync.Mutex
	last snapshot
	used time.Time // last created or polled
}

type watchers struct {
	mu sync.Mutex
	m  map[string]*watcher
}

func newWatchers() *watchers { return &watchers{m: map[string]*watcher{}} }

func (h *Handler) snapshot(ctx context.Context, w *watcher) (snapshot, error) {
	depth := 1
	if w.recursive {
		depth = maxDepth
	}
	snap := snapshot{}
	err := h.walk(ctx, w.sandbox, w.root, depth, func(e *filesystem.EntryInfo) error {
		if len(snap) >= maxEntries {
			return errTooMany
		}
		rel := e.Path[len(w.root):]
		if len(rel) > 0 && rel[0] == '/' {
			rel = rel[1:]
		}
		snap[rel] = e
		return nil
	})
	return snap, err
}

// diff is what changed from a to b.
func diff(a, b snapshot, withEntry bool) []*filesystem.FilesystemEvent {
	var evs []*filesystem.FilesystemEvent
	ev := func(name string, typ filesystem.EventType, e *filesystem.EntryInfo) {
		fe := &filesystem.FilesystemEvent{Name: name, Type: typ}
		if withEntry && e != nil {
			fe.Entry = e
		}
		evs = append(evs, fe)
	}
	for name, e := range b {
		old, ok := a[name]
		switch {
		case !ok:
			ev(name, filesystem.EventType_EVENT_TYPE_CREATE, e)
		case old.Type != e.Type:
			ev(name, filesystem.EventType_EVENT_TYPE_REMOVE, old)
			ev(name, filesystem.EventType_EVENT_TYPE_CREATE, e)
		case old.Size != e.Size || !old.ModifiedTime.AsTime().Equal(e.ModifiedTime.AsTime()):
			if e.Type != filesystem.FileType_FILE_TYPE_DIRECTORY {
				ev(name, filesystem.EventType_EVENT_TYPE_WRITE, e)
			}
		case old.Mode != e.Mode:
			ev(name, filesystem.EventType_EVENT_TYPE_CHMOD, e)
		}
	}
	for name, e := range a {
		if _, ok := b[name]; !ok {
			ev(name, filesystem.EventType_EVENT_TYPE_REMOVE, e)
		}
	}
	return evs
}

func (h *Handler) newWatcher(ctx context.Context, t *target, p string, recursive, withEntry bool) (*watcher, error) {
	st, err := h.stat(ctx, t.id, p)
	if err != nil {
		return nil, err
	}
	if st.Type != filesystem.FileType_FILE_TYPE_DIRECTORY {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", p))
	}
	w := &watcher{sandbox: t.id, root: p, recursive: recursive, withEntry: withEntry, used: time.Now()}
	if w.last, err = h.snapshot(ctx, w); err != nil {
		return nil, connectError(err)
	}
	return w, nil
}

// poll lists again and returns the events since the last poll.
func (h *Handler) poll(ctx context.Context, w *watcher) ([]*filesystem.FilesystemEvent, error) {
	snap, err := h.snapshot(ctx, w)
	if errors.Is(err, errdefs.ErrNotFound) {
		snap, err = snapshot{}, nil // the directory itself went away
	}
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := diff(w.last, snap, w.withEntry)
	w.last, w.used = snap, time.Now()
	return evs, nil
}

func (s *fsService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	t, err := mustTarget(ctx)
	if err != nil {
		return err
	}
	p, err := reqPath(req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := s.h.newWatcher(ctx, t, p, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	quiet := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		evs, err := s.h.poll(ctx, w)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return connectError(err)
		}
		for _, e := range evs {
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
				return err
			}
			quiet = time.Now()
		}
		if time.Since(quiet) >= t.keepalive {
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			quiet = time.Now()
		}
	}
}

func (s *fsService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	p, err := reqPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := s.h.newWatcher(ctx, t, p, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, err
	}
	var b [12]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	ws := s.h.watchers
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if len(ws.m) >= maxWatchers {
		// Forget the watchers nobody polled for a while (their client,
		// or their sandbox, is gone).
		for id, w := range ws.m {
			w.mu.Lock()
			stale := time.Since(w.used) > watcherIdle
			w.mu.Unlock()
			if stale {
				delete(ws.m, id)
			}
		}
	}
	n := 0
	for _, w := range ws.m {
		if w.sandbox == t.id {
			n++
		}
	}
	if n >= maxSandboxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("at most %d watchers per sandbox; remove some with RemoveWatcher", maxSandboxWatchers))
	}
	if len(ws.m) >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("at most %d watchers; remove some with RemoveWatcher", maxWatchers))
	}
	ws.m[id] = w
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

func (s *fsService) watcher(ctx context.Context, id string) (*watcher, error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	ws := s.h.watchers
	ws.mu.Lock()
	w := ws.m[id]
	ws.mu.Unlock()
	if w == nil || w.sandbox != t.id {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %s not found", id))
	}
	return w, nil
}

func (s *fsService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	w, err := s.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	evs, err := s.h.poll(ctx, w)
	if err != nil {
		return nil, connectError(err)
	}
	if len(evs) > maxPending {
		evs = evs[:maxPending]
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (s *fsService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	if _, err := s.watcher(ctx, req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	ws := s.h.watchers
	ws.mu.Lock()
	delete(ws.m, req.Msg.GetWatcherId())
	ws.mu.Unlock()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
