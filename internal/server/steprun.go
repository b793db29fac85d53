package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/trajectory"
)

// defaultExecTimeout is the agent's default for an exec without timeout_ms;
// a trajectory step keeps it although it runs as a background process.
const defaultExecTimeout = 10 * time.Minute

// errNotStarted marks a step whose command the sandbox refused: nothing
// ran.
var errNotStarted = errors.New("the command did not start")

// stepTag tags the process of a step's attempt in its sandbox.
func stepTag(attempt string) string { return "dsec-trajectory-step:" + attempt }

// startAndCollect runs a step's command in the sandbox's agent as a
// background process tagged with tag — so that it outlives this server and
// can be found again — and waits for its result. With live, its output is
// followed and sent as it comes. It returns the result and the process id,
// which the caller forgets once the result is recorded.
func (s *Server) startAndCollect(ctx context.Context, n *node, id string, req *api.ExecRequest, tag string,
	live func(api.ExecEvent)) (*api.ExecResult, string, error) {
	breq := *req
	breq.Trajectory, breq.Background, breq.Tag = nil, true, tag
	if breq.TimeoutMs == 0 {
		breq.TimeoutMs = defaultExecTimeout.Milliseconds()
	}
	if breq.MaxOutputBytes == 0 {
		breq.MaxOutputBytes = trajectory.MaxOutputBytes
	}
	var started api.ExecResult
	if err := n.client.AgentJSON(ctx, id, http.MethodPost, "/exec", nil, &breq, &started); err != nil {
		switch errdefs.Code(err) {
		case api.CodeUnavailable, api.CodeDeadlineExceeded, api.CodeInternal:
			return nil, "", err // it may have started
		}
		return nil, "", fmt.Errorf("%w: %w", errNotStarted, err)
	}
	if started.Process == nil {
		return nil, "", fmt.Errorf("agent of %s answered a background exec without a process", id)
	}
	pid := started.Process.ID
	var followers sync.WaitGroup
	if live != nil {
		for _, stream := range []string{"stdout", "stderr"} {
			followers.Add(1)
			go func() {
				defer followers.Done()
				s.follow(ctx, n, id, pid, stream, live)
			}()
		}
	}
	res, err := s.collect(ctx, n, id, pid, &followers)
	return res, pid, err
}

// follow sends a process's output stream as events until it ends.
func (s *Server) follow(ctx context.Context, n *node, id, pid, stream string, live func(api.ExecEvent)) {
	resp, err := n.client.AgentGet(ctx, id, "/procs/"+pid+"/output", url.Values{"stream": {stream}, "follow": {"1"}})
	if err != nil {
		s.log.DebugContext(ctx, "follow step output", "sandbox", id, "process", pid, "err", err)
		return
	}
	defer resp.Body.Close()
	c := chunker{stream: stream, emit: live}
	buf := make([]byte, 32<<10)
	for {
		k, err := resp.Body.Read(buf)
		c.write(buf[:k])
		if err != nil {
			break
		}
	}
	c.flush()
}

// collect waits for a background process to exit (after its followers, if
// any, have sent everything) and returns its result with its output.
func (s *Server) collect(ctx context.Context, n *node, id, pid string, followers *sync.WaitGroup) (*api.ExecResult, error) {
	var p api.Process
	q := url.Values{"output": {"1"}}
	if err := n.client.AgentJSON(ctx, id, http.MethodGet, "/procs/"+pid+"/wait", q, nil, &p); err != nil {
		return nil, fmt.Errorf("wait for process %s of %s: %w", pid, id, err)
	}
	if p.Result == nil {
		return nil, fmt.Errorf("process %s of %s: no result after wait: %w", pid, id, errdefs.ErrUnavailable)
	}
	if followers != nil {
		followers.Wait()
	}
	res := *p.Result
	res.Process, res.Replayed = nil, false
	if res.Stdout != "" || res.Stderr != "" || p.OutputSize == 0 {
		return &res, nil
	}
	// An agent older than wait?output=1 (a sandbox started before an
	// upgrade keeps its agent) sends no output with the result.
	var outs [2][]byte
	for i, stream := range []string{"stdout", "stderr"} {
		resp, err := n.client.AgentGet(ctx, id, "/procs/"+pid+"/output", url.Values{"stream": {stream}})
		if err != nil {
			return nil, fmt.Errorf("read %s of process %s: %w", stream, pid, err)
		}
		outs[i], err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s of process %s: %w: %w", stream, pid, err, errdefs.ErrUnavailable)
		}
	}
	if utf8.Valid(outs[0]) && utf8.Valid(outs[1]) {
		res.Stdout, res.Stderr, res.Encoding = string(outs[0]), string(outs[1]), ""
	} else {
		res.Stdout = base64.StdEncoding.EncodeToString(outs[0])
		res.Stderr = base64.StdEncoding.EncodeToString(outs[1])
		res.Encoding = api.EncodingBase64
	}
	return &res, nil
}

// chunker turns a byte stream into exec events of at most 32 KiB that
// never split a UTF-8 character; bytes that are not UTF-8 go as base64.
type chunker struct {
	stream string
	carry  []byte
	emit   func(api.ExecEvent)
}

const maxChunk = 32 << 10

func (c *chunker) write(p []byte) {
	if len(p) == 0 {
		return
	}
	data := append(c.carry, p...)
	cut := len(data)
	// Hold back an incomplete character at the end for the next write.
	for i := len(data) - 1; i >= 0 && i >= len(data)-utf8.UTFMax; i-- {
		if utf8.RuneStart(data[i]) {
			if !utf8.FullRune(data[i:]) {
				cut = i
			}
			break
		}
	}
	c.carry = bytes.Clone(data[cut:])
	c.send(data[:cut])
}

func (c *chunker) flush() {
	c.send(c.carry)
	c.carry = nil
}

func (c *chunker) send(b []byte) {
	for len(b) > 0 {
		k := min(len(b), maxChunk)
		if k < len(b) {
			// End the chunk before a character that would be split.
			for j := k; j > k-utf8.UTFMax && j > 0; j-- {
				if utf8.RuneStart(b[j]) {
					k = j
					break
				}
			}
		}
		part := b[:k]
		b = b[k:]
		text, enc := string(part), ""
		if !utf8.Valid(part) {
			text, enc = base64.StdEncoding.EncodeToString(part), api.EncodingBase64
		}
		ev := api.ExecEvent{Encoding: enc}
		if c.stream == "stdout" {
			ev.Stdout = &text
		} else {
			ev.Stderr = &text
		}
		c.emit(ev)
	}
}

// ndjsonOut writes a streamed exec answer; the status line goes with the
// first event, so errors before it are ordinary error responses.
type ndjsonOut struct {
	mu     sync.Mutex
	w      http.ResponseWriter
	rc     *http.ResponseController
	begun  bool
	broken bool // the client went away: the step runs on regardless
}

func newNDJSONOut(w http.ResponseWriter) *ndjsonOut {
	return &ndjsonOut{w: w, rc: http.NewResponseController(w)}
}

func (o *ndjsonOut) started() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.begun
}

func (o *ndjsonOut) send(ev api.ExecEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.broken {
		return
	}
	if !o.begun {
		o.w.Header().Set("Content-Type", "application/x-ndjson")
		o.w.WriteHeader(http.StatusOK)
		o.begun = true
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(ev)
	if _, err := o.w.Write(buf.Bytes()); err != nil {
		o.broken = true
		return
	}
	if err := o.rc.Flush(); err != nil {
		o.broken = true
	}
}

// replay sends a recorded result's output as events.
func (o *ndjsonOut) replay(res *api.ExecResult) {
	for _, s := range []struct {
		name string
		get  func() ([]byte, error)
	}{{"stdout", res.StdoutBytes}, {"stderr", res.StderrBytes}} {
		b, err := s.get()
		if err != nil {
			continue
		}
		c := chunker{stream: s.name, emit: o.send}
		c.send(b)
	}
}

// eventError is the error event of a stream that had begun.
func eventError(err error) *api.Error {
	code := errdefs.Code(err)
	msg := err.Error()
	if code == api.CodeInternal {
		msg = "internal error"
	}
	return &api.Error{Code: code, Message: msg}
}
