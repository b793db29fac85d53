package bench

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
)

func TestExecVerdict(t *testing.T) {
	want := "1\n2\ndone\n"
	for _, tc := range []struct {
		res  *api.ExecResult
		out  string
		verd string // prefix; "" for a good answer
	}{
		{&api.ExecResult{}, want, ""},
		{nil, want, "no result"},
		{&api.ExecResult{TimedOut: true}, want, "timed out"},
		{&api.ExecResult{ExitCode: 137}, "1\n", "exit code 137"},
		{&api.ExecResult{}, "1\n2\n", "wrong output: 4 bytes for 9, first difference at byte 4"},
		{&api.ExecResult{}, "1\n3\ndone\n", "wrong output: 9 bytes for 9, first difference at byte 2"},
		{&api.ExecResult{}, want + "x", "wrong output"},
	} {
		got := execVerdict(want, tc.res, tc.out)
		if (tc.verd == "") != (got == "") || !strings.HasPrefix(got, tc.verd) {
			t.Errorf("execVerdict(%+v, %q) = %q, want %q", tc.res, tc.out, got, tc.verd)
		}
	}
}

func TestChaosErrorClasses(t *testing.T) {
	for _, tc := range []struct {
		err       error
		code      string
		retryable bool
	}{
		{&api.Error{Code: api.CodeUnavailable}, api.CodeUnavailable, true},
		{fmt.Errorf("exec: %w", &api.Error{Code: api.CodeInternal}), api.CodeInternal, false},
		{&api.Error{Code: api.CodeNotFound}, api.CodeNotFound, false},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), "transport", true},
		{fmt.Errorf("%w: context deadline exceeded", errDeadline), "timeout", false},
	} {
		if c := errCode(tc.err); c != tc.code || retryable(c) != tc.retryable {
			t.Errorf("%v: code %q retryable %v, want %q %v", tc.err, c, retryable(c), tc.code, tc.retryable)
		}
	}
}

func TestChaosLedger(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := newChaosLedger(t0)
	l.done("exec", 2*time.Second, t0.Add(2*time.Second))
	l.done("create", 5*time.Second, t0.Add(9*time.Second)) // 7 s without an answer before it
	l.done("exec", time.Second, t0.Add(8*time.Second))     // out of order: no negative gap
	l.failed("exec", "a", errors.New("connection refused"))
	l.failed("exec", "a", &api.Error{Code: api.CodeInternal, Message: "boom"})
	l.failed("reset", "a", fmt.Errorf("%w: x", errDeadline))
	l.failed("exec", "a", &api.Error{Code: api.CodeNotFound}) // a is live: lost
	l.created("b")
	l.deleted("b")
	l.failed("exec", "b", &api.Error{Code: api.CodeNotFound}) // b's delete was requested: right
	if l.ok["exec"] != 2 || l.ok["create"] != 1 {
		t.Errorf("ok counts %v", l.ok)
	}
	if l.errs["exec: transport"] != 1 || l.errs["exec: internal"] != 1 || l.errs["reset: timeout"] != 1 || l.errs["exec: not_found"] != 2 {
		t.Errorf("error counts %v", l.errs)
	}
	if l.longestOp != 5*time.Second || l.longestOpName != "create" || l.longestGap != 7*time.Second {
		t.Errorf("longest answer %s (%s), gap %s", l.longestOp, l.longestOpName, l.longestGap)
	}
	if len(l.violations) != 3 { // the internal error, the hang, the lost a; not the refused connection nor b
		t.Errorf("violations %q", l.violations)
	}

	l = newChaosLedger(t0)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		l.created(id)
	}
	l.deleted("d")
	l.deleted("e")
	l.created("e") // a repeated answer does not bring a deleted one back
	if got := strings.Join(l.live(), ","); got != "a,b,c" {
		t.Errorf("live = %s", got)
	}
	// a works; b is gone; c exists and does not work; d was deleted and is
	// gone; e was deleted and is still there.
	l.checkSurvivors(map[string]bool{"a": true, "c": true, "e": true}, map[string]bool{"a": true})
	got := strings.Join(l.violations, "\n")
	for _, want := range []string{"sandbox b that a create answered for is gone", "sandbox c exists but does not run a command",
		"sandbox e was deleted on request and still exists"} {
		if !strings.Contains(got, want) {
			t.Errorf("violations lack %q:\n%s", want, got)
		}
	}
	if len(l.violations) != 3 {
		t.Errorf("violations: %q", l.violations)
	}
	var sb strings.Builder
	if n := l.report(&sb); n != 3 || !strings.Contains(sb.String(), "invariant violations: 3") {
		t.Errorf("report %d:\n%s", n, sb.String())
	}
}
