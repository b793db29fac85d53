package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/compat/e2b/envdpb/process"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// processService is process.Process on dsec's background processes: Start
// runs the command as a background exec (so it outlives its client, as in
// envd), streams its output from the agent's rings and ends with its exit.
type processService struct{ h *Handler }

// procConfigs remembers the ProcessConfig of the processes started through
// E2B, for List (the agent keeps no argv).
type procConfigs struct {
	mu sync.Mutex
	m  map[string]map[uint32]*process.ProcessConfig // dsec sandbox id → pid
}

const maxConfigs = 4096

func newProcConfigs() *procConfigs {
	return &procConfigs{m: map[string]map[uint32]*process.ProcessConfig{}}
}

func (c *procConfigs) put(id string, pid uint32, cfg *process.ProcessConfig) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m[id] == nil {
		if len(c.m) >= maxConfigs {
			clear(c.m)
		}
		c.m[id] = map[uint32]*process.ProcessConfig{}
	}
	if len(c.m[id]) >= maxConfigs {
		clear(c.m[id])
	}
	c.m[id][pid] = cfg
}

func (c *procConfigs) get(id string, pid uint32) *process.ProcessConfig {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[id][pid]
}

func (c *procConfigs) drop(id string, pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m[id], pid)
	if len(c.m[id]) == 0 {
		delete(c.m, id)
	}
}

// rawBody is a request body sent as it is, not as JSON.
type rawBody []byte

// agentJSON calls the agent and decodes its JSON answer into out.
func (h *Handler) agentJSON(ctx context.Context, id, method, p string, q url.Values, in, out any) error {
	var body io.Reader
	if r, ok := in.(rawBody); ok {
		body = bytes.NewReader(r)
	} else if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := h.b.Agent(ctx, id, method, p, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("agent %s %s: decode answer: %w", method, p, err)
	}
	return nil
}

func mustTarget(ctx context.Context) (*target, error) {
	t := targetFrom(ctx)
	if t == nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("no sandbox"))
	}
	return t, nil
}

// find is the running background process a selector names.
func (s *processService) find(ctx context.Context, t *target, sel *process.ProcessSelector) (*api.Process, error) {
	if sel == nil || sel.Selector == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector (pid or tag) is required"))
	}
	var list api.ProcessList
	if err := s.h.agentJSON(ctx, t.id, http.MethodGet, "/procs", nil, nil, &list); err != nil {
		return nil, connectError(err)
	}
	for i := range list.Processes {
		p := &list.Processes[i]
		if !p.Running {
			continue
		}
		switch v := sel.Selector.(type) {
		case *process.ProcessSelector_Pid:
			if uint32(p.Pid) == v.Pid {
				return p, nil
			}
		case *process.ProcessSelector_Tag:
			if p.Tag != "" && p.Tag == v.Tag {
				return p, nil
			}
		}
	}
	switch v := sel.Selector.(type) {
	case *process.ProcessSelector_Pid:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *process.ProcessSelector_Tag:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %s not found", v.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector (pid or tag) is required"))
}

func (s *processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	var list api.ProcessList
	if err := s.h.agentJSON(ctx, t.id, http.MethodGet, "/procs", nil, nil, &list); err != nil {
		return nil, connectError(err)
	}
	out := &process.ListResponse{}
	for _, p := range list.Processes {
		if !p.Running {
			continue
		}
		info := &process.ProcessInfo{Pid: uint32(p.Pid), Config: s.h.procs.get(t.id, uint32(p.Pid))}
		if info.Config == nil {
			info.Config = &process.ProcessConfig{}
		}
		if p.Tag != "" {
			info.Tag = proto.String(p.Tag)
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

// forgetAfter is how long an exited process's record stays.
const forgetAfter = 30 * time.Second

// maxArgBytes bounds a command line.
const maxArgBytes = 1 << 20

func (s *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	t, err := mustTarget(ctx)
	if err != nil {
		return err
	}
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	n := len(cfg.GetCmd())
	for _, a := range cfg.GetArgs() {
		n += len(a)
	}
	if n > maxArgBytes {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("command line is over %d bytes", maxArgBytes))
	}
	argv := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	if u := t.user; u != "" && u != "root" {
		// envd runs as the user the SDK names; dsec commands run as root,
		// so drop to that user (it must exist in the image).
		argv = append([]string{"runuser", "-u", u, "--"}, argv...)
	}
	ereq := &api.ExecRequest{Cmd: argv, Env: cfg.GetEnvs(), Background: true, Tag: req.Msg.GetTag(),
		TimeoutMs: t.timeout.Milliseconds()}
	if cfg.Cwd != nil {
		cwd, err := absPath(cfg.GetCwd())
		if err != nil {
			return connectError(err)
		}
		ereq.Cwd = cwd
	}
	if pty := req.Msg.GetPty(); pty != nil {
		ereq.TTY = &api.TTYSize{Rows: int(pty.GetSize().GetRows()), Cols: int(pty.GetSize().GetCols())}
	}
	// As envd: stdin stays open unless the request says stdin:false
	// (SDKs before envd 0.3.0 could not say it); a terminal always takes
	// input.
	ereq.StdinOpen = req.Msg.Stdin == nil || req.Msg.GetStdin() || ereq.TTY != nil
	var res api.ExecResult
	if err := s.h.agentJSON(ctx, t.id, http.MethodPost, "/exec", nil, ereq, &res); err != nil {
		return connectError(err)
	}
	if res.Process == nil {
		return connect.NewError(connect.CodeInternal, errors.New("agent started no process"))
	}
	pid := uint32(res.Process.Pid)
	s.h.procs.put(t.id, pid, cfg)
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	return s.h.follow(ctx, t, res.Process.ID, pid, ereq.TTY != nil, send, true)
}

func (s *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	t, err := mustTarget(ctx)
	if err != nil {
		return err
	}
	p, err := s.find(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	pid := uint32(p.Pid)
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	return s.h.follow(ctx, t, p.ID, pid, false, send, false)
}

// chunk is a piece of a process's output.
type chunk struct {
	stderr bool
	data   []byte
	err    error // the stream's end (io.EOF) or failure
}

// follow streams a background process's output as data events (from the
// start of what the agent's rings hold), with keepalives while it is
// quiet, then its end event. The process outlives a client that leaves.
// With forget, the agent's record is dropped a while after the end is
// sent.
func (h *Handler) follow(ctx context.Context, t *target, procID string, pid uint32, tty bool,
	send func(*process.ProcessEvent) error, forget bool) error {
	ch := make(chan chunk, 8)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	streams := []string{"stdout", "stderr"}
	if tty {
		streams = streams[:1]
	}
	for _, name := range streams {
		go func() {
			resp, err := h.b.Agent(rctx, t.id, http.MethodGet, "/procs/"+procID+"/output", url.Values{"stream": {name}, "follow": {"1"}}, nil)
			if err != nil {
				ch <- chunk{stderr: name == "stderr", err: err}
				return
			}
			defer resp.Body.Close()
			for {
				buf := make([]byte, 32<<10)
				n, err := resp.Body.Read(buf)
				if n > 0 {
					select {
					case ch <- chunk{stderr: name == "stderr", data: buf[:n]}:
					case <-rctx.Done():
						return
					}
				}
				if err != nil {
					select {
					case ch <- chunk{stderr: name == "stderr", err: err}:
					case <-rctx.Done():
					}
					return
				}
			}
		}()
	}
	ka := time.NewTicker(t.keepalive)
	defer ka.Stop()
	open := len(streams)
	for open > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ka.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case c := <-ch:
			if c.err != nil {
				open--
				if !errors.Is(c.err, io.EOF) {
					return connectError(c.err)
				}
				continue
			}
			d := &process.ProcessEvent_DataEvent{}
			switch {
			case tty:
				d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: c.data}
			case c.stderr:
				d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: c.data}
			default:
				d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: c.data}
			}
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}); err != nil {
				return err
			}
			ka.Reset(t.keepalive)
		}
	}
	var v api.Process
	for v.Result == nil {
		// The streams end when the process exits; wait in slices so
		// keepalives keep flowing if its descendants held them open.
		if err := h.agentJSON(ctx, t.id, http.MethodGet, "/procs/"+procID+"/wait", url.Values{"timeout_ms": {"30000"}}, nil, &v); err != nil {
			return connectError(err)
		}
		if v.Result == nil {
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		}
	}
	if v.Result.TimedOut {
		// As envd: the process's lifetime was the request's deadline, so
		// the stream ends with it (the SDK's TimeoutError).
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("context deadline exceeded"))
	}
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(v.Result)}}); err != nil {
		return err
	}
	if forget {
		// Late readers (a Connect still streaming it) get a grace period
		// before the agent's record and its output go.
		bg := context.WithoutCancel(ctx)
		time.AfterFunc(forgetAfter, func() {
			h.procs.drop(t.id, pid)
			dctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			_ = h.agentJSON(dctx, t.id, http.MethodDelete, "/procs/"+procID, nil, nil, nil)
		})
	}
	return nil
}

// endEvent is envd's end event for a result: Go's ProcessState wording.
func endEvent(r *api.ExecResult) *process.ProcessEvent_EndEvent {
	if r.Signal != "" {
		name := strings.ToLower(strings.TrimPrefix(r.Signal, "SIG"))
		switch name {
		case "kill":
			name = "killed"
		case "term":
			name = "terminated"
		case "int":
			name = "interrupt"
		}
		msg := "signal: " + name
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: msg, Error: proto.String(msg)}
	}
	msg := fmt.Sprintf("exit status %d", r.ExitCode)
	ev := &process.ProcessEvent_EndEvent{ExitCode: int32(r.ExitCode), Exited: true, Status: msg}
	if r.ExitCode != 0 {
		ev.Error = proto.String(msg)
	}
	return ev
}

// Update resizes a process's terminal.
func (s *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	p, err := s.find(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if pty := req.Msg.GetPty(); pty != nil {
		size := &api.TTYSize{Rows: int(pty.GetSize().GetRows()), Cols: int(pty.GetSize().GetCols())}
		if err := s.h.agentJSON(ctx, t.id, http.MethodPost, "/procs/"+p.ID+"/resize", nil, size, nil); err != nil {
			return nil, connectError(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// StreamInput takes input events on a client stream: a start naming the
// process, then data events, each written as SendInput writes. connect-go
// serves client streams over HTTP/1.1 as well as h2 (the request body is
// read as it comes).
func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	var p *api.Process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			if p, err = s.find(ctx, t, ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("data before the start event naming the process"))
			}
			if err := s.h.writeInput(ctx, t, p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Keepalive:
		default:
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unknown input event %T", ev))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

// SendInput writes to a process's stdin (or its terminal: dsec takes
// stdin and pty bytes alike and sends them where the process reads).
func (s *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	p, err := s.find(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := s.h.writeInput(ctx, t, p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// writeInput sends input to the agent in pieces it takes.
func (h *Handler) writeInput(ctx context.Context, t *target, p *api.Process, in *process.ProcessInput) error {
	var data []byte
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		data = v.Stdin
	case *process.ProcessInput_Pty:
		data = v.Pty
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input (stdin or pty bytes) is required"))
	}
	for len(data) > 0 {
		n := min(len(data), maxInputChunk)
		if err := h.agentJSON(ctx, t.id, http.MethodPost, "/procs/"+p.ID+"/stdin", nil, rawBody(data[:n]), nil); err != nil {
			return connectError(err)
		}
		data = data[n:]
	}
	return nil
}

// maxInputChunk is the most one agent write takes (agent.MaxStdinWrite).
const maxInputChunk = 1 << 20

func (s *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	var sig string
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = "KILL"
	case process.Signal_SIGNAL_SIGTERM:
		sig = "TERM"
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v is not SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Msg.GetSignal()))
	}
	p, err := s.find(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	err = s.h.agentJSON(ctx, t.id, http.MethodPost, "/procs/"+p.ID+"/signal", url.Values{"signal": {sig}}, nil, nil)
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", p.Pid))
	}
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// CloseStdin closes a process's stdin (on a terminal: types ^D). A
// process started with stdin:false has none to close: a no-op, as in envd.
func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	t, err := mustTarget(ctx)
	if err != nil {
		return nil, err
	}
	p, err := s.find(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	err = s.h.agentJSON(ctx, t.id, http.MethodPost, "/procs/"+p.ID+"/stdin/close", nil, nil, nil)
	if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}
