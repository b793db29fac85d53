package trajectory_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/trajectory"
)

func fp(t *testing.T, req api.ExecRequest) string {
	t.Helper()
	f, err := trajectory.Fingerprint(&req)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(f, "sha256:") || len(f) != 71 {
		t.Fatalf("fingerprint %q", f)
	}
	return f
}

func TestFingerprint(t *testing.T) {
	base := api.ExecRequest{Cmd: []string{"/bin/sh", "-c", "echo hi"}, Env: map[string]string{"A": "1", "B": "2"}, Stdin: "in"}
	ref := fp(t, base)
	for _, tc := range []struct {
		name string
		req  api.ExecRequest
		same bool
	}{
		{"shell is /bin/sh -c", api.ExecRequest{Shell: "echo hi", Env: map[string]string{"B": "2", "A": "1"}, Stdin: "in"}, true},
		{"cwd / is the default", api.ExecRequest{Cmd: base.Cmd, Env: base.Env, Cwd: "/", Stdin: "in"}, true},
		{"stdin as base64", api.ExecRequest{Cmd: base.Cmd, Env: base.Env, Stdin: "aW4=", StdinEncoding: "base64"}, true},
		{"limits do not count", api.ExecRequest{Cmd: base.Cmd, Env: base.Env, Stdin: "in", TimeoutMs: 5, MaxOutputBytes: 7}, true},
		{"the trajectory key does not count", api.ExecRequest{Cmd: base.Cmd, Env: base.Env, Stdin: "in", Trajectory: &api.Trajectory{ID: "x", Step: 3}}, true},
		{"another argv", api.ExecRequest{Cmd: []string{"/bin/sh", "-c", "echo ho"}, Env: base.Env, Stdin: "in"}, false},
		{"argv split differently", api.ExecRequest{Cmd: []string{"/bin/sh", "-c echo hi"}, Env: base.Env, Stdin: "in"}, false},
		{"another env value", api.ExecRequest{Cmd: base.Cmd, Env: map[string]string{"A": "1", "B": "3"}, Stdin: "in"}, false},
		{"fewer env", api.ExecRequest{Cmd: base.Cmd, Env: map[string]string{"A": "1"}, Stdin: "in"}, false},
		{"another cwd", api.ExecRequest{Cmd: base.Cmd, Env: base.Env, Cwd: "/tmp", Stdin: "in"}, false},
		{"no stdin", api.ExecRequest{Cmd: base.Cmd, Env: base.Env}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fp(t, tc.req) == ref; got != tc.same {
				t.Fatalf("same fingerprint = %v, want %v", got, tc.same)
			}
		})
	}
	if _, err := trajectory.Fingerprint(&api.ExecRequest{Shell: "x", Stdin: "!!", StdinEncoding: "base64"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad base64 stdin: %v", err)
	}
}

func TestCheckExec(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  api.ExecRequest
		ok   bool
	}{
		{"ok", api.ExecRequest{Shell: "x", Trajectory: &api.Trajectory{ID: "job-1/ep:2", Step: 0}}, true},
		{"empty id", api.ExecRequest{Shell: "x", Trajectory: &api.Trajectory{ID: ""}}, false},
		{"id with a space", api.ExecRequest{Shell: "x", Trajectory: &api.Trajectory{ID: "a b"}}, false},
		{"id too long", api.ExecRequest{Shell: "x", Trajectory: &api.Trajectory{ID: strings.Repeat("a", 257)}}, false},
		{"negative step", api.ExecRequest{Shell: "x", Trajectory: &api.Trajectory{ID: "a", Step: -1}}, false},
		{"background", api.ExecRequest{Shell: "x", Background: true, Trajectory: &api.Trajectory{ID: "a"}}, false},
		{"tag", api.ExecRequest{Shell: "x", Tag: "t", Trajectory: &api.Trajectory{ID: "a"}}, false},
		{"output over the cap", api.ExecRequest{Shell: "x", MaxOutputBytes: trajectory.MaxOutputBytes + 1, Trajectory: &api.Trajectory{ID: "a"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := trajectory.CheckExec(&tc.req)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errdefs.ErrInvalid)) {
				t.Fatalf("CheckExec = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	here := trajectory.Place{Sandbox: "sb-1", Generation: 2}
	done := &store.Step{Fingerprint: "f", Sandbox: "sb-1", Generation: 2, State: api.StepDone}
	with := func(f func(*store.Step)) *store.Step { s := *done; f(&s); return &s }
	for _, tc := range []struct {
		name string
		rec  *store.Step
		want trajectory.Action
	}{
		{"no record", nil, trajectory.Run},
		{"same command, same sandbox", done, trajectory.Replay},
		{"another command", with(func(s *store.Step) { s.Fingerprint = "g" }), trajectory.Diverge},
		{"another command in another sandbox", with(func(s *store.Step) { s.Fingerprint, s.Sandbox = "g", "sb-2" }), trajectory.Diverge},
		{"same command, another sandbox", with(func(s *store.Step) { s.Sandbox = "sb-2" }), trajectory.Rerun},
		{"same command, before a reset", with(func(s *store.Step) { s.Generation = 1 }), trajectory.Rerun},
		{"running", with(func(s *store.Step) { s.State = api.StepRunning }), trajectory.Settle},
		{"running another command", with(func(s *store.Step) { s.State, s.Fingerprint = api.StepRunning, "g" }), trajectory.Settle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := trajectory.Decide(tc.rec, "f", here); got != tc.want {
				t.Fatalf("Decide = %v, want %v", got, tc.want)
			}
		})
	}
}
