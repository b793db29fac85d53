package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// The simulated trainer: a separate process (this test binary run again)
// that runs steps of a trajectory, each appending a line to a file, and
// reports each step on stdout.
const trainerEnv = "DSEC_E2E_TRAINER"

type trainerStep struct {
	Step     int64  `json:"step"`
	Replayed bool   `json:"replayed"`
	Stdout   string `json:"stdout"`
}

func stepCmd(i int64) string {
	return fmt.Sprintf("sleep 0.2; echo step %d >> /work/log; echo did %d", i, i)
}

// TestHelperTrainer is the trainer process; as a test it does nothing.
func TestHelperTrainer(t *testing.T) {
	if os.Getenv(trainerEnv) == "" {
		t.Skip("the trainer process of TestTrajectoryTrainer")
	}
	c := client.New(os.Getenv("DSEC_URL"), os.Getenv("DSEC_API_KEY"))
	sb, traj := os.Getenv("TRAINER_SANDBOX"), os.Getenv("TRAINER_TRAJECTORY")
	steps, _ := strconv.ParseInt(os.Getenv("TRAINER_STEPS"), 10, 64)
	every, _ := strconv.ParseInt(os.Getenv("TRAINER_CHECKPOINT_EVERY"), 10, 64)
	for i := int64(1); i <= steps; i++ {
		fmt.Printf("begin %d\n", i)
		key := &api.Trajectory{ID: traj, Step: i}
		if i == 1 {
			key.CheckpointEvery = every // a setting of the trajectory from now on
		}
		res, err := c.Exec(context.Background(), sb, &api.ExecRequest{Shell: stepCmd(i), Trajectory: key})
		if err != nil {
			fmt.Printf("error %v\n", err)
			os.Exit(2)
		}
		if os.Getenv("TRAINER_MARK") != "" {
			// Not a step: a plain exec right after the answer.
			if _, err := c.Exec(context.Background(), sb, &api.ExecRequest{Shell: fmt.Sprintf(": > /work/after-%d", i)}); err != nil {
				fmt.Printf("error %v\n", err)
				os.Exit(2)
			}
		}
		b, _ := json.Marshal(trainerStep{Step: i, Replayed: res.Replayed, Stdout: res.Stdout})
		fmt.Printf("%s\n", b)
	}
	os.Exit(0)
}

// trainer starts the trainer process; lines come on the channel.
func trainer(t *testing.T, s *testutil.Server, sandbox, traj string, steps int, env ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperTrainer$", "-test.count=1")
	cmd.Env = append(os.Environ(), trainerEnv+"=1", "DSEC_URL="+s.URL, "DSEC_API_KEY="+s.Key,
		"TRAINER_SANDBOX="+sandbox, "TRAINER_TRAJECTORY="+traj, fmt.Sprintf("TRAINER_STEPS=%d", steps))
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

func stepsOf(t *testing.T, lines <-chan string) map[int64]trainerStep {
	t.Helper()
	got := map[int64]trainerStep{}
	for l := range lines {
		if strings.HasPrefix(l, "begin ") {
			continue
		}
		var st trainerStep
		if err := json.Unmarshal([]byte(l), &st); err != nil {
			t.Fatalf("trainer said %q", l)
		}
		got[st.Step] = st
	}
	return got
}

// waitStep waits until the log shows step as recorded (running or done).
func waitStep(t *testing.T, c *client.Client, traj string, step int64) {
	t.Helper()
	testutil.Eventually(t, time.Minute, fmt.Sprintf("step %d of %s recorded", step, traj), func() error {
		l, err := c.GetTrajectory(context.Background(), traj)
		if err != nil {
			return err
		}
		for _, st := range l.Steps {
			if st.Step == step {
				return nil
			}
		}
		return fmt.Errorf("steps %+v", l.Steps)
	})
}

// TestTrajectoryTrainer is the preemption story: a trainer runs ten steps,
// each appending a line to a file, and is killed during step seven; the
// restarted trainer replays steps one to ten. Steps already done come back
// from the log (the one in flight when it died finished on the server and
// is replayed too), so the file has each line exactly once. Then a
// divergent step runs and drops the log after it, and the log survives a
// kill -9 of the server.
func TestTrajectoryTrainer(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	sb := newSandbox(t, c, nil)
	sh(t, c, sb.ID, "mkdir /work")
	const traj = "job-7/episode-1"

	cmd, lines := trainer(t, s, sb.ID, traj, 10)
	for l := range lines {
		if l == "begin 7" {
			break
		}
	}
	waitStep(t, c, traj, 7) // step 7 is on the server: kill the trainer now
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	for range lines {
	}

	_, lines = trainer(t, s, sb.ID, traj, 10)
	got := stepsOf(t, lines)
	if len(got) != 10 {
		t.Fatalf("restarted trainer finished %d steps: %+v", len(got), got)
	}
	for i := int64(1); i <= 10; i++ {
		want := i <= 7
		if got[i].Replayed != want || got[i].Stdout != fmt.Sprintf("did %d\n", i) {
			t.Errorf("step %d: %+v, want replayed=%v", i, got[i], want)
		}
	}
	var want strings.Builder
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&want, "step %d\n", i)
	}
	if log := sh(t, c, sb.ID, "cat /work/log"); log != want.String() {
		t.Fatalf("after the replay /work/log =\n%s\nwant each step once:\n%s", log, want.String())
	}

	t.Run("a divergent step runs and drops the log after it", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "echo changed >> /work/log; echo new",
			Trajectory: &api.Trajectory{ID: traj, Step: 4}})
		if err != nil || res.Replayed || res.Stdout != "new\n" {
			t.Fatalf("divergent step 4: %+v %v", res, err)
		}
		l, err := c.GetTrajectory(ctx, traj)
		if err != nil || len(l.Steps) != 4 || l.Steps[3].State != api.StepDone || l.Steps[3].Sandbox != sb.ID {
			t.Fatalf("log after the divergence: %+v %v", l, err)
		}
		res, err = c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: stepCmd(5), Trajectory: &api.Trajectory{ID: traj, Step: 5}})
		if err != nil || res.Replayed {
			t.Fatalf("step 5 after the divergence must run: %+v %v", res, err)
		}
		if log := sh(t, c, sb.ID, "tail -n 2 /work/log"); log != "changed\nstep 5\n" {
			t.Fatalf("log tail %q", log)
		}
	})

	t.Run("the log survives a server restart", func(t *testing.T) {
		s.Kill()
		s.Restart()
		c = s.Client
		before := sh(t, c, sb.ID, "cat /work/log")
		for i := int64(1); i <= 5; i++ {
			req := &api.ExecRequest{Shell: stepCmd(i), Trajectory: &api.Trajectory{ID: traj, Step: i}}
			if i == 4 {
				req.Shell = "echo changed >> /work/log; echo new"
			}
			res, err := c.Exec(ctx, sb.ID, req)
			if err != nil || !res.Replayed {
				t.Fatalf("step %d after the restart: %+v %v", i, res, err)
			}
		}
		if after := sh(t, c, sb.ID, "cat /work/log"); after != before {
			t.Fatalf("replays after the restart ran commands: %q then %q", before, after)
		}
	})
}
