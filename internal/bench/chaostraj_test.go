package bench

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
)

func TestTrajCommand(t *testing.T) {
	if got := trajCommand(7); got != "echo step-7 >> /traj.log" {
		t.Errorf("trajCommand(7) = %q", got)
	}
	tr := newChaosTraj("x", "sb")
	if tr.sent() != 0 {
		t.Errorf("a new trajectory sent %d steps", tr.sent())
	}
	tr.pending = true
	if tr.sent() != 1 {
		t.Errorf("a pending first step: sent %d, want 1", tr.sent())
	}
	tr.next, tr.pending = 4, false
	if tr.sent() != 3 {
		t.Errorf("next 4, none pending: sent %d, want 3", tr.sent())
	}
}

func TestTrajAnswerVerdict(t *testing.T) {
	for _, tc := range []struct {
		res    *api.ExecResult
		resent bool
		verd   string // prefix; "" for a right answer
	}{
		{&api.ExecResult{}, false, ""},
		{&api.ExecResult{Replayed: true}, false, ""},
		{&api.ExecResult{Replayed: true}, true, ""},
		{&api.ExecResult{}, true, "a step already answered ran again"},
		{nil, false, "no result"},
		{&api.ExecResult{Stdout: "x"}, false, "unexpected output"},
		{&api.ExecResult{ExitCode: 2}, false, "exit code 2"},
		{&api.ExecResult{ExitCode: 137}, false, ""},
		{&api.ExecResult{ExitCode: -1, Signal: "SIGKILL"}, false, ""},
	} {
		got := trajAnswerVerdict(tc.res, tc.resent)
		if (tc.verd == "") != (got == "") || !strings.HasPrefix(got, tc.verd) {
			t.Errorf("trajAnswerVerdict(%+v, %v) = %q, want %q", tc.res, tc.resent, got, tc.verd)
		}
	}
}

func TestTrajFileVerdict(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		sent int64
		ok   []int64
		want []string
	}{
		{"nothing sent", "", 0, nil, nil},
		{"all ran once", "step-1\nstep-2\nstep-3\n", 3, []int64{1, 2, 3}, nil},
		{"killed step left no line", "step-1\nstep-3\n", 3, []int64{1, 3}, nil},
		{"pending step ran", "step-1\nstep-2\n", 2, []int64{1}, nil},
		{"pending step did not run", "step-1\n", 2, []int64{1}, nil},
		{"step ran twice", "step-1\nstep-2\nstep-2\n", 2, []int64{1, 2}, []string{"step 2 ran 2 times"}},
		{"killed step ran twice", "step-1\nstep-1\n", 1, nil, []string{"step 1 ran 2 times"}},
		{"successful step missing", "step-1\n", 2, []int64{1, 2}, []string{"step 2 answered as successful left no line"}},
		{"empty file, successful step", "", 1, []int64{1}, []string{"step 1 answered as successful left no line"}},
		{"step never sent", "step-1\nstep-5\n", 1, []int64{1}, []string{`unexpected line "step-5"`}},
		{"garbage", "step-1\nstep-x\n\n", 1, []int64{1}, []string{`unexpected line "step-x"`, `unexpected line ""`}},
	} {
		got := trajFileVerdict(tc.file, tc.sent, tc.ok)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: trajFileVerdict = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestTrajLogVerdict(t *testing.T) {
	log := &api.TrajectoryLog{ID: "chaos-sb", Steps: []api.TrajectoryStep{
		{Step: 1, Sandbox: "sb", State: api.StepDone, Replays: 2},
		{Step: 2, Sandbox: "sb", State: api.StepDone},
		{Step: 3, Sandbox: "other", State: api.StepDone, Replays: 1},
		{Step: 4, Sandbox: "sb", State: api.StepRunning},
	}}
	bad, replays := trajLogVerdict(log, "sb", []int64{1, 2})
	if len(bad) != 0 || replays != 3 {
		t.Errorf("a right log: %q, %d replays; want none, 3", bad, replays)
	}
	bad, _ = trajLogVerdict(log, "sb", []int64{1, 3, 4, 5})
	want := []string{
		"step 3 is recorded in sandbox other, not sb",
		"step 4 answered as successful is running in the log",
		"step 5 answered as successful is not in the log",
	}
	if !reflect.DeepEqual(bad, want) {
		t.Errorf("a wrong log: %q, want %q", bad, want)
	}
}

func TestTrajCountsReport(t *testing.T) {
	l := newChaosLedger(time.Now())
	var b strings.Builder
	l.report(&b)
	if strings.Contains(b.String(), "trajectory steps") {
		t.Errorf("a run without trajectories reports them:\n%s", b.String())
	}
	l.trajAnswered(false, false, false)
	l.trajRetry()
	l.trajAnswered(true, false, true)
	l.trajAnswered(false, true, true)
	l.trajChecked(2, 5)
	b.Reset()
	l.report(&b)
	for _, want := range []string{
		"trajectory steps: 1 answered as run, 2 as replayed; 1 sent again after an error (1 of them then answered), 1 answered steps sent again (must replay)",
		"trajectories checked at the end: 1, with 2 steps answered as successful; replays counted by the server: 5",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
