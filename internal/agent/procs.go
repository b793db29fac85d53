package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// maxFinished bounds the records of exited background processes kept for
// reading; past it the oldest are forgotten.
const maxFinished = 1024

// Headers of GET /procs/{id}/output.
const (
	HeaderOffset     = "X-Dsec-Offset"      // offset of the first byte sent
	HeaderNextOffset = "X-Dsec-Next-Offset" // offset after the last byte sent; a trailer when following
	HeaderDropped    = "X-Dsec-Dropped"     // bytes of the stream lost to the ring so far
)

// proc is a background process and its output.
type proc struct {
	n              int // its number, in start order
	id             string
	tag            string
	child          *child // nil if it never started
	started        time.Time
	stdout, stderr *output
	done           chan struct{} // closed once exited and drained
	in             *input        // stdin kept open (stdin_open), or nil
	pty            *os.File      // the terminal's master side (tty), or nil

	mu     sync.Mutex
	exited *time.Time
	result *api.ExecResult
}

func (p *proc) view() api.Process {
	out, _ := p.stdout.size()
	errOut, _ := p.stderr.size()
	v := api.Process{ID: p.id, StartedAt: p.started, OutputSize: out + errOut, Tag: p.tag}
	v.StdinOpen = p.in.isOpen() && !isClosed(p.done)
	if p.child != nil {
		v.Pid = p.child.pid
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v.Running, v.ExitedAt, v.Result = p.result == nil, p.exited, p.result
	return v
}

// procTable holds the background processes.
type procTable struct {
	mu       sync.Mutex
	next     int
	procs    map[string]*proc
	finished []*proc // oldest first
}

func newProcTable() *procTable { return &procTable{procs: make(map[string]*proc)} }

func (t *procTable) add(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	p.n, p.id = t.next, fmt.Sprintf("p-%d", t.next)
	t.procs[p.id] = p
}

func (t *procTable) get(id string) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.procs[id]; ok {
		return p, nil
	}
	return nil, errdefs.NotFound("process %s", id)
}

// finish records a process's exit and forgets the oldest exited ones over
// the bound.
func (t *procTable) finish(p *proc, res api.ExecResult, exited time.Time) {
	p.mu.Lock()
	p.result, p.exited = &res, &exited
	p.mu.Unlock()
	close(p.done)

	t.mu.Lock()
	defer t.mu.Unlock()
	t.finished = append(t.finished, p)
	for len(t.finished) > maxFinished {
		delete(t.procs, t.finished[0].id)
		t.finished = t.finished[1:]
	}
}

func (t *procTable) remove(p *proc) error {
	if !isClosed(p.done) {
		return fmt.Errorf("delete process %s: still running: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.procs, p.id)
	t.finished = slices.DeleteFunc(t.finished, func(q *proc) bool { return q == p })
	return nil
}

func (t *procTable) list() []api.Process {
	t.mu.Lock()
	ps := make([]*proc, 0, len(t.procs))
	for _, p := range t.procs {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	slices.SortFunc(ps, func(a, b *proc) int { return a.n - b.n })
	views := make([]api.Process, len(ps))
	for i, p := range ps {
		views[i] = p.view()
	}
	return views
}

// execBackground starts a command, answers with its handle at once and
// keeps its output in rings until it is deleted.
func (s *Server) execBackground(w http.ResponseWriter, r *http.Request, spec *execSpec) {
	v, err := s.startBackground(spec)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	logger(r).InfoContext(r.Context(), "exec background", "argv0", spec.argv[0], "process", v.ID, "pid", v.Pid)
	writeJSON(w, http.StatusOK, &api.ExecResult{Process: &v})
}

// startBackground starts a background process; one that cannot start is
// recorded as exited with the reason, not an error.
func (s *Server) startBackground(spec *execSpec) (api.Process, error) {
	p := &proc{
		stdout:  newOutput(spec.maxOutput),
		stderr:  newOutput(spec.maxOutput),
		started: time.Now(),
		done:    make(chan struct{}),
		tag:     spec.tag,
	}
	c, err := s.start(spec, p.stdout, p.stderr)
	var se *startError
	if err != nil && !errors.As(err, &se) {
		return api.Process{}, err
	}
	if c != nil {
		p.child, p.started, p.pty = c.child, c.started, c.io.pty
		if spec.keepStdin {
			f := c.io.stdin
			if c.io.pty != nil {
				f = c.io.pty
			}
			p.in = newInput(f, c.io.pty != nil)
			if spec.stdin != nil {
				// Written first, before any write through the route.
				p.in.turn <- struct{}{}
				go func() {
					defer p.in.release()
					_, _ = f.Write(spec.stdin) // EPIPE, or closed by drain or close
				}()
			}
		}
	}
	s.procs.add(p)
	if se != nil {
		res, msg := se.result()
		_, _ = p.stderr.Write(msg)
		p.stdout.close()
		p.stderr.close()
		s.procs.finish(p, res, p.started)
	} else {
		go s.procs.run(p, c, spec.timeout)
	}
	return p.view(), nil
}

func (t *procTable) run(p *proc, c *command, timeout time.Duration) {
	res := c.result(c.wait(context.Background(), timeout))
	p.stdout.close()
	p.stderr.close()
	_, outDropped := p.stdout.size()
	_, errDropped := p.stderr.size()
	setDropped(&res, outDropped, errDropped)
	t.finish(p, res, c.exited)
}

func (s *Server) proc(w http.ResponseWriter, r *http.Request) *proc {
	p, err := s.procs.get(r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
	}
	return p
}

func (s *Server) handleListProcs(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, &api.ProcessList{Processes: s.procs.list()})
}

func (s *Server) handleGetProc(w http.ResponseWriter, r *http.Request) {
	if p := s.proc(w, r); p != nil {
		v := p.view()
		writeJSON(w, http.StatusOK, &v)
	}
}

func (s *Server) handleDeleteProc(w http.ResponseWriter, r *http.Request) {
	p := s.proc(w, r)
	if p == nil {
		return
	}
	if err := s.procs.remove(p); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleWait blocks until the process exits, timeout_ms passes (if given)
// or the client goes away. With output=1, the result of an exited process
// carries what the rings still hold of its stdout and stderr.
func (s *Server) handleWait(w http.ResponseWriter, r *http.Request) {
	p := s.proc(w, r)
	if p == nil {
		return
	}
	withOutput, err := queryBool(r, "output")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var expired <-chan time.Time
	if r.URL.Query().Has("timeout_ms") {
		ms, err := queryInt(r, "timeout_ms", 0, maxTimeoutMs)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-p.done:
	case <-expired:
	case <-r.Context().Done():
		return
	}
	v := p.view()
	if withOutput && v.Result != nil {
		res := *v.Result
		out, _ := p.stdout.read(0, nil)
		errOut, _ := p.stderr.read(0, nil)
		setOutput(&res, out, errOut)
		v.Result = &res
	}
	writeJSON(w, http.StatusOK, &v)
}

func (s *Server) handleSignal(w http.ResponseWriter, r *http.Request) {
	p := s.proc(w, r)
	if p == nil {
		return
	}
	sig, ok := parseSignal(r.URL.Query().Get("signal"))
	if !ok {
		s.writeError(w, r, errdefs.Invalid("signal %q is not one of TERM, KILL, INT, HUP, QUIT, USR1, USR2", r.URL.Query().Get("signal")))
		return
	}
	if p.child == nil || isClosed(p.child.done) {
		s.writeError(w, r, fmt.Errorf("signal process %s: it has exited: %w", p.id, errdefs.ErrFailedPrecondition))
		return
	}
	p.child.signalGroup(sig)
	v := p.view()
	writeJSON(w, http.StatusOK, &v)
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// handleOutput sends a stream's bytes from offset, clamped to what the
// ring still holds; with follow=1 it keeps sending until the stream ends.
func (s *Server) handleOutput(w http.ResponseWriter, r *http.Request) {
	p := s.proc(w, r)
	if p == nil {
		return
	}
	if acceptsNDJSON(r) {
		s.handleOutputEvents(w, r, p)
		return
	}
	q := r.URL.Query()
	var o *output
	switch q.Get("stream") {
	case "", "stdout":
		o = p.stdout
	case "stderr":
		o = p.stderr
	default:
		s.writeError(w, r, errdefs.Invalid("stream %q is not stdout or stderr", q.Get("stream")))
		return
	}
	off, err := queryInt(r, "offset", 0, math.MaxInt64)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	follow, err := queryBool(r, "follow")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	if !follow {
		data, st := o.read(off, nil)
		h.Set(HeaderOffset, strconv.FormatInt(st.start, 10))
		h.Set(HeaderNextOffset, strconv.FormatInt(st.next, 10))
		h.Set(HeaderDropped, strconv.FormatInt(st.dropped, 10))
		h.Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(data)
		return
	}
	_, st := o.read(off, []byte{})
	h.Set(HeaderOffset, strconv.FormatInt(st.start, 10))
	h.Set(HeaderDropped, strconv.FormatInt(st.dropped, 10))
	h.Set("Trailer", HeaderNextOffset)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	// If the client reads slower than the ring turns over, the bytes it
	// missed are skipped: the trailer shows the gap.
	next, buf := st.start, make([]byte, 32<<10)
	for {
		data, st := o.read(next, buf)
		next = st.next
		if len(data) > 0 {
			if _, err := w.Write(data); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			continue
		}
		if st.closed {
			break
		}
		select {
		case <-st.wake:
		case <-r.Context().Done():
			return
		}
	}
	h.Set(HeaderNextOffset, strconv.FormatInt(next, 10))
}

// queryInt parses an optional integer parameter in [lo, hi]; absent is lo.
func queryInt(r *http.Request, name string, lo, hi int64) (int64, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return lo, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, errdefs.Invalid("%s %q is not an integer in [%d, %d]", name, s, lo, hi)
	}
	return n, nil
}

func queryBool(r *http.Request, name string) (bool, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, errdefs.Invalid("%s %q is not a boolean", name, s)
	}
	return b, nil
}
