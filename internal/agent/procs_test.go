package agent_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/testutil"
)

// startBackground starts a background command and returns its handle.
func (a *testAgent) startBackground(t *testing.T, req api.ExecRequest) api.Process {
	t.Helper()
	req.Background = true
	res, err := a.Exec(t.Context(), &req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Process == nil {
		t.Fatalf("background exec returned no process: %+v", res)
	}
	return *res.Process
}

func (a *testAgent) process(t *testing.T, target string) api.Process {
	t.Helper()
	resp, body := a.do("GET", target, nil)
	wantStatus(t, resp, body, http.StatusOK)
	return decode[api.Process](t, body)
}

// output reads a stream and checks the offset headers.
func (a *testAgent) output(t *testing.T, id, query string) (string, int64, int64, int64) {
	t.Helper()
	resp, body := a.do("GET", fmt.Sprintf("/procs/%s/output?%s", id, query), nil)
	wantStatus(t, resp, body, http.StatusOK)
	h := func(k string) int64 {
		n, err := strconv.ParseInt(resp.Header.Get(k), 10, 64)
		if err != nil {
			t.Fatalf("header %s: %q", k, resp.Header.Get(k))
		}
		return n
	}
	return string(body), h(agent.HeaderOffset), h(agent.HeaderNextOffset), h(agent.HeaderDropped)
}

func TestBackground(t *testing.T) {
	a := startAgent(t)
	t.Run("output, follow, wait, delete", func(t *testing.T) {
		gate := filepath.Join(t.TempDir(), "gate")
		p := a.startBackground(t, api.ExecRequest{
			Shell: fmt.Sprintf("echo start; echo warn >&2; while [ ! -e %s ]; do sleep 0.01; done; echo end; exit 7", gate),
		})
		if !strings.HasPrefix(p.ID, "p-") || p.Pid <= 0 || !p.Running || p.StartedAt.IsZero() {
			t.Fatalf("process %+v", p)
		}
		resp, body := a.do("GET", "/procs", nil)
		wantStatus(t, resp, body, http.StatusOK)
		if l := decode[api.ProcessList](t, body); len(l.Processes) != 1 || l.Processes[0].ID != p.ID {
			t.Errorf("list %+v", l)
		}
		eventually(t, "output appears", func() bool { return a.process(t, "/procs/"+p.ID).OutputSize == 11 })
		if got, off, next, dropped := a.output(t, p.ID, "stream=stdout&offset=0"); got != "start\n" || off != 0 || next != 6 || dropped != 0 {
			t.Errorf("stdout %q [%d, %d) dropped %d", got, off, next, dropped)
		}
		if got, off, next, _ := a.output(t, p.ID, "stream=stdout&offset=2"); got != "art\n" || off != 2 || next != 6 {
			t.Errorf("stdout from 2: %q [%d, %d)", got, off, next)
		}
		if got, _, _, _ := a.output(t, p.ID, "stream=stderr"); got != "warn\n" {
			t.Errorf("stderr %q", got)
		}
		if p := a.process(t, "/procs/"+p.ID+"/wait?timeout_ms=10"); !p.Running {
			t.Errorf("wait with a timeout on a running process: %+v", p)
		}

		// Follow from offset 6 while the process still runs.
		req, _ := http.NewRequest("GET", "/procs/"+p.ID+"/output?offset=6&follow=1", nil)
		resp, err := a.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.Header.Get(agent.HeaderOffset) != "6" {
			t.Errorf("follow offset %q", resp.Header.Get(agent.HeaderOffset))
		}
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		followed, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if string(followed) != "end\n" || resp.Trailer.Get(agent.HeaderNextOffset) != "10" {
			t.Errorf("followed %q, next offset %q", followed, resp.Trailer.Get(agent.HeaderNextOffset))
		}

		done := a.process(t, "/procs/"+p.ID+"/wait")
		if done.Running || done.Result == nil || done.Result.ExitCode != 7 || done.ExitedAt == nil {
			t.Fatalf("after wait: %+v", done)
		}
		resp2, body := a.do("DELETE", "/procs/"+p.ID, nil)
		wantStatus(t, resp2, body, http.StatusNoContent)
		resp2, body = a.do("GET", "/procs/"+p.ID, nil)
		wantError(t, resp2, body, api.CodeNotFound)
	})
	t.Run("signal", func(t *testing.T) {
		p := a.startBackground(t, api.ExecRequest{Shell: "sleep 1000 & wait"})
		resp, body := a.do("DELETE", "/procs/"+p.ID, nil)
		wantError(t, resp, body, api.CodeFailedPrecondition)
		resp, body = a.do("POST", "/procs/"+p.ID+"/signal?signal=BOGUS", nil)
		wantError(t, resp, body, api.CodeInvalid)
		resp, body = a.do("POST", "/procs/"+p.ID+"/signal?signal=TERM", nil)
		wantStatus(t, resp, body, http.StatusOK)
		done := a.process(t, "/procs/"+p.ID+"/wait")
		if done.Result == nil || done.Result.ExitCode != 143 || done.Result.Signal != "SIGTERM" {
			t.Fatalf("after TERM: %+v", done.Result)
		}
		resp, body = a.do("POST", "/procs/"+p.ID+"/signal?signal=KILL", nil)
		wantError(t, resp, body, api.CodeFailedPrecondition)
	})
	t.Run("ring keeps the last bytes", func(t *testing.T) {
		testutil.Require(t, testutil.Tool("seq"))
		full := seqOutput(1000)
		p := a.startBackground(t, api.ExecRequest{Shell: "seq 1 1000", MaxOutputBytes: 100})
		if done := a.process(t, "/procs/"+p.ID+"/wait"); done.Result == nil || done.Result.StdoutDropped != int64(len(full)-100) || !done.Result.Truncated {
			t.Fatalf("result %+v", done.Result)
		}
		got, off, next, dropped := a.output(t, p.ID, "offset=0")
		if got != full[len(full)-100:] || off != int64(len(full)-100) || next != int64(len(full)) || dropped != off {
			t.Errorf("output %q [%d, %d) dropped %d", got, off, next, dropped)
		}
		if got, off, _, _ := a.output(t, p.ID, "offset=999999"); got != "" || off != int64(len(full)) {
			t.Errorf("past the end: %q at %d", got, off)
		}
	})
	t.Run("command not found", func(t *testing.T) {
		p := a.startBackground(t, api.ExecRequest{Cmd: []string{"dsec-no-such-command"}})
		if p.Running || p.Result == nil || p.Result.ExitCode != 127 {
			t.Fatalf("process %+v", p)
		}
		if got, _, _, _ := a.output(t, p.ID, "stream=stderr"); !strings.Contains(got, "command not found") {
			t.Errorf("stderr %q", got)
		}
	})
	t.Run("wait with output", func(t *testing.T) {
		p := a.startBackground(t, api.ExecRequest{Shell: "echo outt; printf 'e\\377' >&2; exit 5", MaxOutputBytes: 4})
		done := a.process(t, "/procs/"+p.ID+"/wait?output=1")
		r := done.Result
		if r == nil || r.ExitCode != 5 || r.Encoding != api.EncodingBase64 || !r.Truncated || r.StdoutDropped != 1 {
			t.Fatalf("result %+v", r)
		}
		if out, _ := r.StdoutBytes(); string(out) != "utt\n" { // the last 4 bytes
			t.Errorf("stdout %q", out)
		}
		if errOut, _ := r.StderrBytes(); string(errOut) != "e\xff" {
			t.Errorf("stderr %q", errOut)
		}
		if plain := a.process(t, "/procs/"+p.ID+"/wait"); plain.Result.Stdout != "" {
			t.Errorf("wait without output=1 sent output: %+v", plain.Result)
		}
		resp, body := a.do("GET", "/procs/"+p.ID+"/wait?output=maybe", nil)
		wantError(t, resp, body, api.CodeInvalid)
	})
	t.Run("tag", func(t *testing.T) {
		p := a.startBackground(t, api.ExecRequest{Shell: "true", Tag: "trajectory:x/1"})
		if p.Tag != "trajectory:x/1" {
			t.Fatalf("started process %+v", p)
		}
		if got := a.process(t, "/procs/"+p.ID); got.Tag != p.Tag {
			t.Fatalf("read back %+v", got)
		}
		for name, req := range map[string]api.ExecRequest{
			"not background": {Shell: "true", Tag: "x"},
			"too long":       {Shell: "true", Tag: strings.Repeat("x", 513), Background: true},
			"trajectory":     {Shell: "true", Trajectory: &api.Trajectory{ID: "x"}},
		} {
			if _, err := a.Exec(t.Context(), &req); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%s: got %v, want invalid", name, err)
			}
		}
	})
	t.Run("timeout", func(t *testing.T) {
		p := a.startBackground(t, api.ExecRequest{Shell: "sleep 1000", TimeoutMs: 100})
		if done := a.process(t, "/procs/"+p.ID+"/wait"); done.Result == nil || !done.Result.TimedOut || done.Result.Signal != "SIGKILL" {
			t.Fatalf("result %+v", done.Result)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		p := a.startBackground(t, api.ExecRequest{Shell: "true"})
		for _, tt := range []struct{ name, method, target, code string }{
			{"unknown process", "GET", "/procs/p-999999", api.CodeNotFound},
			{"unknown process output", "GET", "/procs/p-999999/output", api.CodeNotFound},
			{"bad stream", "GET", "/procs/" + p.ID + "/output?stream=stdin", api.CodeInvalid},
			{"negative offset", "GET", "/procs/" + p.ID + "/output?offset=-1", api.CodeInvalid},
			{"bad follow", "GET", "/procs/" + p.ID + "/output?follow=maybe", api.CodeInvalid},
			{"bad wait timeout", "GET", "/procs/" + p.ID + "/wait?timeout_ms=x", api.CodeInvalid},
		} {
			t.Run(tt.name, func(t *testing.T) {
				resp, body := a.do(tt.method, tt.target, nil)
				wantError(t, resp, body, tt.code)
			})
		}
	})
}
