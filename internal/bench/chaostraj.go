package bench

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/dsec-project/dsec/api"
)

// chaosTrajFile is the file every trajectory step of `dsec bench chaos`
// appends its line to, in the trajectory's sandbox.
const chaosTrajFile = "/traj.log"

// chaosTraj is one trajectory of the chaos load. It has a sandbox of its
// own that the load never resets, forks, snapshots or deletes, so every
// step's effects stay in it and the end can check them exactly: each
// step's line is in the file at most once, and exactly once for a step
// answered as successful.
type chaosTraj struct {
	mu          sync.Mutex // steps go one after the other, as a trainer sends them
	id, sandbox string
	// next is the step to send; pending says it was sent and got no
	// answer (an error): the next turn sends it again, as a client would.
	next    int64
	pending bool
	// ok are the steps answered with exit code 0 (their line must be in
	// the file once); a step answered otherwise (its command was killed
	// under it) may have written its line or not.
	ok []int64
}

func newChaosTraj(id, sandbox string) *chaosTraj {
	return &chaosTraj{id: id, sandbox: sandbox, next: 1}
}

// trajLine is what step n appends to the file.
func trajLine(n int64) string { return "step-" + strconv.FormatInt(n, 10) }

// trajCommand is step n's command.
func trajCommand(n int64) string { return "echo " + trajLine(n) + " >> " + chaosTrajFile }

// sent is the highest step ever sent.
func (t *chaosTraj) sent() int64 {
	if t.pending {
		return t.next
	}
	return t.next - 1
}

// trajAnswerVerdict checks a step's answer: "" if right. A step sent again
// after it was answered (resent) must be a replay; any answer must have no
// output, and a run must say it ran the command (exit 0) or that it was
// killed (a signal or 137: the agent died under it).
func trajAnswerVerdict(res *api.ExecResult, resent bool) string {
	switch {
	case res == nil:
		return "no result"
	case resent && !res.Replayed:
		return "a step already answered ran again (replayed: false)"
	case res.Stdout != "" || res.Stderr != "":
		return fmt.Sprintf("unexpected output %q %q", chaosTrim(res.Stdout, 80), chaosTrim(res.Stderr, 80))
	case res.ExitCode != 0 && res.Signal == "" && res.ExitCode < 128:
		return fmt.Sprintf("exit code %d", res.ExitCode)
	}
	return ""
}

// trajFileVerdict checks a trajectory's file at the end against the steps
// sent (1 to sent) and those answered as successful (ok): every line is a
// step's, no step's line is there twice (a step ran at most once), and a
// successful step's line is there. It returns the violations.
func trajFileVerdict(file string, sent int64, ok []int64) []string {
	var out []string
	counts := map[int64]int{}
	for _, line := range strings.Split(strings.TrimSuffix(file, "\n"), "\n") {
		if line == "" && file == "" {
			break
		}
		n, err := strconv.ParseInt(strings.TrimPrefix(line, "step-"), 10, 64)
		if err != nil || !strings.HasPrefix(line, "step-") || n < 1 || n > sent {
			out = append(out, fmt.Sprintf("unexpected line %q", chaosTrim(line, 80)))
			continue
		}
		counts[n]++
	}
	steps := make([]int64, 0, len(counts))
	for n := range counts {
		steps = append(steps, n)
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i] < steps[j] })
	for _, n := range steps {
		if counts[n] > 1 {
			out = append(out, fmt.Sprintf("step %d ran %d times", n, counts[n]))
		}
	}
	for _, n := range ok {
		if counts[n] == 0 {
			out = append(out, fmt.Sprintf("step %d answered as successful left no line", n))
		}
	}
	return out
}

// trajLogVerdict checks the server's log of a trajectory against the
// steps answered as successful: each is recorded, done, in the
// trajectory's sandbox. It returns the violations and the replays the log
// counts.
func trajLogVerdict(log *api.TrajectoryLog, sandbox string, ok []int64) ([]string, int64) {
	var out []string
	var replays int64
	byStep := map[int64]api.TrajectoryStep{}
	for _, s := range log.Steps {
		byStep[s.Step] = s
		replays += s.Replays
	}
	for _, n := range ok {
		s, found := byStep[n]
		switch {
		case !found:
			out = append(out, fmt.Sprintf("step %d answered as successful is not in the log", n))
		case s.State != api.StepDone:
			out = append(out, fmt.Sprintf("step %d answered as successful is %s in the log", n, s.State))
		case s.Sandbox != sandbox:
			out = append(out, fmt.Sprintf("step %d is recorded in sandbox %s, not %s", n, s.Sandbox, sandbox))
		}
	}
	return out, replays
}

// trajAnswered counts a step's answer: a retry (sent again after an
// error), a resend (a step already answered, sent again as a trainer that
// resumes would) and whether it was replayed.
func (l *chaosLedger) trajAnswered(retry, resent, replayed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case replayed:
		l.traj.replayed++
	default:
		l.traj.ran++
	}
	if retry {
		l.traj.retriedOK++
	}
	if resent {
		l.traj.resent++
	}
}

// trajRetry counts a step sent again after an error.
func (l *chaosLedger) trajRetry() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.traj.retries++
}

// trajChecked records the end's check of a trajectory: its steps answered
// as successful and the replays its log counts.
func (l *chaosLedger) trajChecked(ok int, replays int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.traj.checked++
	l.traj.checkedSteps += ok
	l.traj.logReplays += replays
}

// trajCounts are the trajectory figures of the report.
type trajCounts struct {
	ran, replayed, retries, retriedOK, resent int
	checked, checkedSteps                     int
	logReplays                                int64
}
