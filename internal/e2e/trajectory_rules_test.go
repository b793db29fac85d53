package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

func stepReq(traj string, step int64, shell string) *api.ExecRequest {
	return &api.ExecRequest{Shell: shell, Trajectory: &api.Trajectory{ID: traj, Step: step}}
}

func execStep(t *testing.T, c *client.Client, id string, req *api.ExecRequest) *api.ExecResult {
	t.Helper()
	res, err := c.Exec(ctxT(t), id, req)
	if err != nil {
		t.Fatalf("exec %q at step %d: %v", req.Shell, req.Trajectory.Step, err)
	}
	return res
}

// TestTrajectoryCrashMidStep kills the server with SIGKILL while a step
// runs. The command lives on in the sandbox's agent; after the restart the
// trainer's retry of the same step waits for it and gets its result,
// replayed: the command ran exactly once.
func TestTrajectoryCrashMidStep(t *testing.T) {
	s := startServer(t)
	c := s.Client
	sb := newSandbox(t, c, nil)
	const traj = "crash"
	cmd := "sleep 1.5; echo once >> /log; echo out; echo err >&2; exit 3"
	go c.Exec(context.Background(), sb.ID, stepReq(traj, 1, cmd)) // dies with the server
	waitStep(t, c, traj, 1)
	testutil.Eventually(t, time.Minute, "the step's command started", func() error {
		if ps, err := c.ListProcesses(ctxT(t), sb.ID); err != nil || len(ps) == 0 {
			return fmt.Errorf("processes %+v %v", ps, err)
		}
		return nil
	})
	s.Kill()
	s.Restart()
	c = s.Client

	res := execStep(t, c, sb.ID, stepReq(traj, 1, cmd))
	if !res.Replayed || res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" {
		t.Fatalf("step after the crash: %+v", res)
	}
	if log := sh(t, c, sb.ID, "cat /log"); log != "once\n" {
		t.Fatalf("the command ran more than once: /log = %q", log)
	}
	testutil.Eventually(t, 30*time.Second, "the step's process forgotten once recorded", func() error {
		if ps, err := c.ListProcesses(ctxT(t), sb.ID); err != nil || len(ps) != 0 {
			return fmt.Errorf("%+v %v", ps, err)
		}
		return nil
	})
}

// TestTrajectoryRules checks where a step replays and where it runs, and
// the trajectory routes.
func TestTrajectoryRules(t *testing.T) {
	s := startServer(t, "--trajectory-retention", "3s")
	c := s.Client
	ctx := ctxT(t)
	a := newSandbox(t, c, nil)
	b := newSandbox(t, c, nil)
	const traj = "rules"
	count := "echo x >> /n; wc -l < /n"

	if r := execStep(t, c, a.ID, stepReq(traj, 0, count)); r.Replayed || strings.TrimSpace(r.Stdout) != "1" {
		t.Fatalf("first run: %+v", r)
	}
	t.Run("same sandbox replays", func(t *testing.T) {
		if r := execStep(t, c, a.ID, stepReq(traj, 0, count)); !r.Replayed || strings.TrimSpace(r.Stdout) != "1" {
			t.Fatalf("replay: %+v", r)
		}
	})
	t.Run("limits are not part of the command", func(t *testing.T) {
		req := stepReq(traj, 0, count)
		req.TimeoutMs, req.MaxOutputBytes = 5000, 100
		if r := execStep(t, c, a.ID, req); !r.Replayed {
			t.Fatalf("replay with other limits ran: %+v", r)
		}
	})
	t.Run("another sandbox runs it again", func(t *testing.T) {
		if r := execStep(t, c, b.ID, stepReq(traj, 0, count)); r.Replayed || strings.TrimSpace(r.Stdout) != "1" {
			t.Fatalf("in sandbox b: %+v", r)
		}
		if r := execStep(t, c, b.ID, stepReq(traj, 0, count)); !r.Replayed {
			t.Fatalf("b again: %+v", r)
		}
	})
	t.Run("a reset makes it run again", func(t *testing.T) {
		if _, err := c.Reset(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
		if r := execStep(t, c, b.ID, stepReq(traj, 0, count)); r.Replayed || strings.TrimSpace(r.Stdout) != "1" {
			t.Fatalf("after reset: %+v", r)
		}
	})
	t.Run("another tenant has its own log", func(t *testing.T) {
		tn, err := c.CreateTenant(ctx, "rules-other")
		if err != nil {
			t.Fatal(err)
		}
		k, err := c.CreateKey(ctx, tn.ID, false)
		if err != nil {
			t.Fatal(err)
		}
		oc := client.New(s.URL, k.Secret)
		if _, err := oc.GetTrajectory(ctx, traj); !client.IsNotFound(err) {
			t.Fatalf("other tenant reads the log: %v", err)
		}
		ob := newSandbox(t, oc, nil)
		if r := execStep(t, oc, ob.ID, stepReq(traj, 0, count)); r.Replayed {
			t.Fatalf("other tenant got a replay: %+v", r)
		}
		if _, err := c.Exec(ctx, ob.ID, stepReq(traj, 0, count)); !client.IsNotFound(err) {
			t.Fatalf("a step in another tenant's sandbox: %v", err)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		for name, req := range map[string]*api.ExecRequest{
			"background":      {Shell: "true", Background: true, Trajectory: &api.Trajectory{ID: traj}},
			"negative step":   {Shell: "true", Trajectory: &api.Trajectory{ID: traj, Step: -1}},
			"empty id":        {Shell: "true", Trajectory: &api.Trajectory{}},
			"no command":      {Trajectory: &api.Trajectory{ID: traj, Step: 9}},
			"relative cwd":    {Shell: "true", Cwd: "tmp", Trajectory: &api.Trajectory{ID: traj, Step: 9}},
			"output too big":  {Shell: "true", MaxOutputBytes: 2 << 20, Trajectory: &api.Trajectory{ID: traj, Step: 9}},
			"bad stdin codec": {Shell: "true", Stdin: "x", StdinEncoding: "hex", Trajectory: &api.Trajectory{ID: traj, Step: 9}},
		} {
			if _, err := c.Exec(ctx, a.ID, req); !client.IsInvalid(err) {
				t.Errorf("%s: %v, want invalid_argument", name, err)
			}
		}
		if l, _ := c.GetTrajectory(ctx, traj); l == nil || len(l.Steps) != 1 {
			t.Fatalf("a refused request left steps: %+v", l)
		}
		resp, err := http.DefaultClient.Do(authed(t, s.Key, "POST", s.URL+"/v1/sandboxes/"+a.ID+"/exec",
			`{"shell": "true", "trajectory": {"id": "x", "step": 1}, "nope": 1}`))
		if err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("unknown field: %v %v", resp.Status, err)
		}
		resp.Body.Close()
	})
	t.Run("a large body, the trajectory after the stdin", func(t *testing.T) {
		stdin := strings.Repeat("0123456789abcdef", 200<<10) // 3.2 MiB
		body := `{"shell": "wc -c; echo x >> /big", "stdin": "` + stdin + `", "trajectory": {"id": "big", "step": 1}}`
		for i, want := range []bool{false, true} {
			resp, err := http.DefaultClient.Do(authed(t, s.Key, "POST", s.URL+"/v1/sandboxes/"+a.ID+"/exec", body))
			if err != nil {
				t.Fatal(err)
			}
			var res api.ExecResult
			err = json.NewDecoder(resp.Body).Decode(&res)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || res.Replayed != want || strings.TrimSpace(res.Stdout) != "3276800" {
				t.Fatalf("run %d: %s %+v %v", i, resp.Status, res, err)
			}
		}
		if n := sh(t, c, a.ID, "wc -l < /big"); strings.TrimSpace(n) != "1" {
			t.Fatalf("the large step ran %s times", n)
		}
		plain, err := c.Exec(ctx, a.ID, &api.ExecRequest{Shell: "wc -c", Stdin: stdin})
		if err != nil || strings.TrimSpace(plain.Stdout) != "3276800" {
			t.Fatalf("large plain exec: %+v %v", plain, err)
		}
	})
	t.Run("delete from a step", func(t *testing.T) {
		for i := int64(1); i <= 3; i++ {
			execStep(t, c, a.ID, stepReq(traj, i, "true"))
		}
		if err := c.DeleteTrajectory(ctx, traj, 2); err != nil {
			t.Fatal(err)
		}
		if l, err := c.GetTrajectory(ctx, traj); err != nil || len(l.Steps) != 2 || l.Steps[1].Step != 1 {
			t.Fatalf("after deleting from step 2: %+v %v", l, err)
		}
		if err := c.DeleteTrajectory(ctx, traj, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := c.GetTrajectory(ctx, traj); !client.IsNotFound(err) {
			t.Fatalf("deleted trajectory: %v", err)
		}
	})
	t.Run("retention", func(t *testing.T) {
		execStep(t, c, a.ID, stepReq("short-lived", 1, "true"))
		testutil.Eventually(t, 30*time.Second, "the trajectory purged after a retention of 3 s", func() error {
			if _, err := c.GetTrajectory(ctx, "short-lived"); !client.IsNotFound(err) {
				return fmt.Errorf("get: %v", err)
			}
			return nil
		})
		if r := execStep(t, c, a.ID, stepReq("short-lived", 1, "true")); r.Replayed {
			t.Fatalf("replayed from a purged log: %+v", r)
		}
	})
}

// TestTrajectoryStream runs a step with NDJSON streaming: its output comes
// live (the command waits for a file the test writes only once it has
// seen the first line), and its replay sends the recorded output as
// events.
func TestTrajectoryStream(t *testing.T) {
	s := startServer(t)
	c := s.Client
	sb := newSandbox(t, c, nil)
	req := stepReq("stream", 1, `echo one; i=0; while [ ! -e /gate ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
		[ -e /gate ] && echo two || echo late; printf 'e\377' >&2; exit 4`)
	for _, replay := range []bool{false, true} {
		var out, errOut bytes.Buffer
		res, err := c.ExecStream(ctxT(t), sb.ID, req, func(ev api.ExecEvent) error {
			b, err := ev.Bytes()
			if ev.Stdout != nil {
				out.Write(b)
			} else {
				errOut.Write(b)
			}
			if !replay && out.String() == "one\n" {
				return c.WriteFile(ctxT(t), sb.ID, "/gate", strings.NewReader(""), 0)
			}
			return err
		})
		if err != nil || res.Replayed != replay || res.ExitCode != 4 || res.Stdout != "" {
			t.Fatalf("replay=%v: %+v %v", replay, res, err)
		}
		if out.String() != "one\ntwo\n" || errOut.String() != "e\xff" {
			t.Fatalf("replay=%v: streamed %q, %q", replay, out.String(), errOut.String())
		}
	}
	full, err := c.Exec(ctxT(t), sb.ID, req)
	if err != nil || !full.Replayed || full.Encoding != api.EncodingBase64 {
		t.Fatalf("buffered replay: %+v %v", full, err)
	}
	if b, _ := full.StderrBytes(); string(b) != "e\xff" {
		t.Fatalf("recorded stderr %q", b)
	}
}

func authed(t *testing.T, key, method, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	return req
}
