package bench

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// chaosLedger is the bookkeeping of `dsec bench chaos`: what every answer
// was, which sandboxes a create answered for and which were deleted on
// request, and every broken invariant. It is safe for concurrent use and
// pure (no I/O), so that its verdicts are unit-tested.
type chaosLedger struct {
	mu         sync.Mutex
	ok         map[string]int // per operation
	errs       map[string]int // "operation: code"
	violations []string
	// sandboxes maps every id a create, batch or fork answered with to
	// whether it was deleted on request.
	sandboxes map[string]bool
	// longestOp is the slowest answer; lastOK and longestGap the time
	// without a single successful answer.
	longestOp, longestGap time.Duration
	longestOpName         string
	lastOK                time.Time
	traj                  trajCounts
}

func newChaosLedger(now time.Time) *chaosLedger {
	return &chaosLedger{ok: map[string]int{}, errs: map[string]int{}, sandboxes: map[string]bool{}, lastOK: now}
}

// errCode names an error for the counts: its API code, "transport" for a
// request that got no answer from the server (connection refused or
// reset: the server is down), "timeout" when the caller's own deadline
// passed.
func errCode(err error) string {
	if c := client.Code(err); c != "" {
		return c
	}
	if errors.Is(err, errDeadline) {
		return "timeout"
	}
	return "transport"
}

// errDeadline marks an answer that did not come before the operation's
// own deadline: a hang.
var errDeadline = errors.New("no answer before the operation's deadline")

// retryable says whether an error is one a caller can act on by retrying:
// the server was away (transport), or said so (unavailable, deadline
// exceeded, resource exhausted, a conflict with a concurrent operation).
// Anything else under chaos is an unclear error: reported as a violation.
func retryable(code string) bool {
	switch code {
	case "transport", api.CodeUnavailable, api.CodeDeadlineExceeded, api.CodeResourceExhausted,
		api.CodeFailedPrecondition, api.CodeAlreadyExists:
		return true
	}
	return false
}

// execVerdict checks one exec answer against the output it must have.
// It returns "" for a byte-exact answer, else what is wrong with it.
func execVerdict(want string, res *api.ExecResult, out string) string {
	switch {
	case res == nil:
		return "no result"
	case res.TimedOut:
		return "timed out"
	case res.ExitCode != 0:
		return fmt.Sprintf("exit code %d", res.ExitCode)
	case out != want:
		i := 0
		for i < len(out) && i < len(want) && out[i] == want[i] {
			i++
		}
		return fmt.Sprintf("wrong output: %d bytes for %d, first difference at byte %d", len(out), len(want), i)
	}
	return ""
}

// done records a successful operation that took d, answered at now.
func (l *chaosLedger) done(op string, d time.Duration, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ok[op]++
	if d > l.longestOp {
		l.longestOp, l.longestOpName = d, op
	}
	if gap := now.Sub(l.lastOK); gap > l.longestGap {
		l.longestGap = gap
	}
	if now.After(l.lastOK) {
		l.lastOK = now
	}
}

// failed records an operation on sandbox id (or none) that answered err:
// counted by code; an unclear (not retryable) error or a hang is a
// violation. Not found is the right answer for a sandbox whose delete was
// requested (a delete under way, or done, concurrently).
func (l *chaosLedger) failed(op, id string, err error) {
	code := errCode(err)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs[op+": "+code]++
	if code == api.CodeNotFound && id != "" && l.sandboxes[id] {
		return
	}
	if code == "timeout" {
		l.violations = append(l.violations, fmt.Sprintf("%s hung past its deadline", op))
	} else if !retryable(code) {
		l.violations = append(l.violations, fmt.Sprintf("%s: unclear error %s: %s", op, code, chaosTrim(err.Error(), 200)))
	}
}

// violate records a broken invariant.
func (l *chaosLedger) violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.violations = append(l.violations, fmt.Sprintf(format, args...))
}

// created records a sandbox a create answered for.
func (l *chaosLedger) created(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.sandboxes[id]; !ok {
		l.sandboxes[id] = false
	}
}

// deleted records a delete requested (answered or not: a delete whose
// answer was lost may have taken effect).
func (l *chaosLedger) deleted(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sandboxes[id] = true
}

// live lists the sandboxes answered for and not deleted, sorted.
func (l *chaosLedger) live() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, gone := range l.sandboxes {
		if !gone {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// checkSurvivors compares the sandboxes answered for with what the server
// lists at the end (exists) and which of those ran a command (works): a
// live one missing or not working is a violation, and so is a sandbox
// deleted on request that is still listed.
func (l *chaosLedger) checkSurvivors(exists, works map[string]bool) {
	l.mu.Lock()
	ids := make([]string, 0, len(l.sandboxes))
	for id := range l.sandboxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	gone := make(map[string]bool, len(ids))
	for _, id := range ids {
		gone[id] = l.sandboxes[id]
	}
	l.mu.Unlock()
	for _, id := range ids {
		switch {
		case gone[id] && exists[id]:
			l.violate("sandbox %s was deleted on request and still exists", id)
		case !gone[id] && !exists[id]:
			l.violate("sandbox %s that a create answered for is gone", id)
		case !gone[id] && !works[id]:
			l.violate("sandbox %s exists but does not run a command", id)
		}
	}
}

// report writes the counts, the error codes, the stalls and the
// violations; it returns how many violations there were.
func (l *chaosLedger) report(w interface{ Write([]byte) (int, error) }) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(w, "operations (successful):")
	for _, k := range sortedKeys(l.ok) {
		fmt.Fprintf(w, "  %-22s %7d\n", k, l.ok[k])
	}
	fmt.Fprintln(w, "errors (operation: code):")
	if len(l.errs) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, k := range sortedKeys(l.errs) {
		fmt.Fprintf(w, "  %-40s %7d\n", k, l.errs[k])
	}
	fmt.Fprintf(w, "longest answer: %s (%s); longest time without a successful answer: %s\n",
		l.longestOp.Round(time.Millisecond), l.longestOpName, l.longestGap.Round(time.Millisecond))
	if t := l.traj; t.ran+t.replayed+t.retries > 0 {
		fmt.Fprintf(w, "trajectory steps: %d answered as run, %d as replayed; %d sent again after an error (%d of them then answered), %d answered steps sent again (must replay)\n",
			t.ran, t.replayed, t.retries, t.retriedOK, t.resent)
		fmt.Fprintf(w, "trajectories checked at the end: %d, with %d steps answered as successful; replays counted by the server: %d\n",
			t.checked, t.checkedSteps, t.logReplays)
	}
	if len(l.violations) == 0 {
		fmt.Fprintln(w, "invariant violations: none")
		return 0
	}
	fmt.Fprintf(w, "invariant violations: %d\n", len(l.violations))
	for i, v := range l.violations {
		if i == 50 {
			fmt.Fprintf(w, "  … %d more\n", len(l.violations)-50)
			break
		}
		fmt.Fprintf(w, "  %s\n", v)
	}
	return len(l.violations)
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func chaosTrim(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
