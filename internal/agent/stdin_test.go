package agent_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/testutil"
)

func TestStdinOpen(t *testing.T) {
	testutil.Require(t, testutil.Tool("cat"))
	a := startAgent(t)
	// The client keeps a connection for execs besides the one for other
	// calls: open both before counting.
	if _, err := a.Exec(t.Context(), &api.ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	fds, _, _ := a.state(t)

	t.Run("pipe: written bytes reach cat, close ends it", func(t *testing.T) {
		p := a.startBackground(t, api.ExecRequest{Cmd: []string{"cat"}, Stdin: "first\n", StdinOpen: true})
		if !p.StdinOpen {
			t.Fatalf("process %+v: stdin_open is false", p)
		}
		resp, body := a.do("POST", "/procs/"+p.ID+"/stdin", strings.NewReader("hello\n"))
		wantStatus(t, resp, body, http.StatusNoContent)
		eventually(t, "cat echoes", func() bool {
			got, _, _, _ := a.output(t, p.ID, "stream=stdout")
			return got == "first\nhello\n"
		})
		resp, body = a.do("POST", "/procs/"+p.ID+"/stdin/close", nil)
		wantStatus(t, resp, body, http.StatusNoContent)
		resp, body = a.do("GET", "/procs/"+p.ID+"/wait?timeout_ms=30000", nil)
		wantStatus(t, resp, body, http.StatusOK)
		v := decode[api.Process](t, body)
		if v.Running || v.Result == nil || v.Result.ExitCode != 0 || v.StdinOpen {
			t.Fatalf("after close: %+v (result %+v)", v, v.Result)
		}
		resp, body = a.do("POST", "/procs/"+p.ID+"/stdin", strings.NewReader("late\n"))
		wantError(t, resp, body, api.CodeFailedPrecondition)
		if !strings.Contains(string(body), "exited") {
			t.Errorf("write after exit: %s", body)
		}
		resp, body = a.do("DELETE", "/procs/"+p.ID+"/stdin", nil)
		wantError(t, resp, body, api.CodeFailedPrecondition)
	})

	t.Run("write after close", func(t *testing.T) {
		// sh ignores its stdin's end while it sleeps; the second write
		// finds it closed.
		p := a.startBackground(t, api.ExecRequest{Shell: "cat; sleep 30", StdinOpen: true})
		resp, body := a.do("DELETE", "/procs/"+p.ID+"/stdin", nil)
		wantStatus(t, resp, body, http.StatusNoContent)
		resp, body = a.do("POST", "/procs/"+p.ID+"/stdin", strings.NewReader("x"))
		wantError(t, resp, body, api.CodeFailedPrecondition)
		if !strings.Contains(string(body), "closed") {
			t.Errorf("write after close: %s", body)
		}
		if v := a.process(t, "/procs/"+p.ID); v.StdinOpen || !v.Running {
			t.Errorf("after close: %+v", v)
		}
		resp, body = a.do("POST", "/procs/"+p.ID+"/signal?signal=KILL", nil)
		wantStatus(t, resp, body, http.StatusOK)
		resp, body = a.do("GET", "/procs/"+p.ID+"/wait?timeout_ms=30000", nil)
		wantStatus(t, resp, body, http.StatusOK)
	})

	t.Run("terminal: input typed, close sends EOF", func(t *testing.T) {
		p := a.startBackground(t, api.ExecRequest{Cmd: []string{"cat"}, StdinOpen: true, TTY: &api.TTYSize{Rows: 24, Cols: 80}})
		resp, body := a.do("POST", "/procs/"+p.ID+"/stdin", strings.NewReader("typed\n"))
		wantStatus(t, resp, body, http.StatusNoContent)
		eventually(t, "the terminal echoes and cat repeats", func() bool {
			got, _, _, _ := a.output(t, p.ID, "stream=stdout")
			return strings.Count(got, "typed") == 2
		})
		resp, body = a.do("POST", "/procs/"+p.ID+"/stdin/close", nil)
		wantStatus(t, resp, body, http.StatusNoContent)
		resp, body = a.do("GET", "/procs/"+p.ID+"/wait?timeout_ms=30000", nil)
		wantStatus(t, resp, body, http.StatusOK)
		if v := decode[api.Process](t, body); v.Running || v.Result == nil || v.Result.ExitCode != 0 {
			t.Fatalf("after ^D: %+v", v)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		p := a.startBackground(t, api.ExecRequest{Cmd: []string{"sleep", "30"}})
		resp, body := a.do("POST", "/procs/"+p.ID+"/stdin", strings.NewReader("x"))
		wantError(t, resp, body, api.CodeFailedPrecondition)
		if !strings.Contains(string(body), "stdin_open") {
			t.Errorf("write without stdin_open: %s", body)
		}
		resp, body = a.do("POST", "/procs/"+p.ID+"/signal?signal=KILL", nil)
		wantStatus(t, resp, body, http.StatusOK)

		resp, body = a.do("POST", "/procs/p-999/stdin", strings.NewReader("x"))
		wantError(t, resp, body, api.CodeNotFound)

		_, err := a.Exec(t.Context(), &api.ExecRequest{Cmd: []string{"cat"}, StdinOpen: true})
		if err == nil || !strings.Contains(err.Error(), "only for background") {
			t.Errorf("stdin_open on a foreground exec: %v", err)
		}

		q := a.startBackground(t, api.ExecRequest{Cmd: []string{"cat"}, StdinOpen: true})
		resp, body = a.do("POST", "/procs/"+q.ID+"/stdin", bytes.NewReader(make([]byte, 1<<20+1)))
		wantError(t, resp, body, api.CodeTooLarge)
		resp, body = a.do("POST", "/procs/"+q.ID+"/stdin/close", nil)
		wantStatus(t, resp, body, http.StatusNoContent)
		for _, id := range []string{p.ID, q.ID} {
			resp, body = a.do("GET", "/procs/"+id+"/wait?timeout_ms=30000", nil)
			wantStatus(t, resp, body, http.StatusOK)
		}
	})

	eventually(t, "no descriptor is left open", func() bool {
		n, _, _ := a.state(t)
		return n <= fds
	})
}

func TestResize(t *testing.T) {
	testutil.Require(t, testutil.Tool("stty"))
	a := startAgent(t)
	// The shell reports its terminal's size each time it is told of a
	// change (SIGWINCH), as "rows cols".
	p := a.startBackground(t, api.ExecRequest{
		Shell:     `trap 'stty size' WINCH; stty size; while :; do sleep 0.05; done`,
		StdinOpen: true, TTY: &api.TTYSize{Rows: 24, Cols: 80},
	})
	eventually(t, "the first size", func() bool {
		got, _, _, _ := a.output(t, p.ID, "stream=stdout")
		return strings.Contains(got, "24 80")
	})
	resp, body := a.do("POST", "/procs/"+p.ID+"/resize", strings.NewReader(`{"rows": 30, "cols": 100}`))
	wantStatus(t, resp, body, http.StatusNoContent)
	eventually(t, "the new size", func() bool {
		got, _, _, _ := a.output(t, p.ID, "stream=stdout")
		return strings.Contains(got, "30 100")
	})
	resp, body = a.do("POST", "/procs/"+p.ID+"/resize", strings.NewReader(`{"rows": 0, "cols": 100}`))
	wantError(t, resp, body, api.CodeInvalid)
	resp, body = a.do("POST", "/procs/"+p.ID+"/signal?signal=KILL", nil)
	wantStatus(t, resp, body, http.StatusOK)
	resp, body = a.do("GET", "/procs/"+p.ID+"/wait?timeout_ms=30000", nil)
	wantStatus(t, resp, body, http.StatusOK)
	resp, body = a.do("POST", "/procs/"+p.ID+"/resize", strings.NewReader(`{"rows": 30, "cols": 100}`))
	wantError(t, resp, body, api.CodeFailedPrecondition)

	q := a.startBackground(t, api.ExecRequest{Cmd: []string{"true"}})
	resp, body = a.do("POST", "/procs/"+q.ID+"/resize", strings.NewReader(`{"rows": 30, "cols": 100}`))
	wantError(t, resp, body, api.CodeFailedPrecondition)
}
