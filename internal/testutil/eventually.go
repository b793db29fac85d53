package testutil

import (
	"testing"
	"time"
)

// Eventually calls cond until it returns nil, polling every few
// milliseconds at first and every 100 ms later, and fails the test
// (Fatalf) if it has not after timeout, with what and cond's last error.
// It states that something happens, not how fast: give a generous
// timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := Poll(timeout, cond); err != nil {
		t.Fatalf("after %v, still not %s: %v", timeout, what, err)
	}
}

// EventuallyTrue is Eventually for a condition without an error to tell.
func EventuallyTrue(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := Poll(timeout, boolCond(cond)); err != nil {
		t.Fatalf("after %v, still not %s", timeout, what)
	}
}

// Poll calls cond as Eventually does and returns nil once it does, or its
// last error after timeout, for a caller that does not fail at once (a
// cleanup, a test that reports more).
func Poll(timeout time.Duration, cond func() error) error {
	return poll(timeout, 5*time.Millisecond, 100*time.Millisecond, cond)
}

// PollEvery is Poll at a fixed short interval, for a state that lasts only
// a while (a sandbox frozen by a checkpoint, a create in flight) and that
// Poll's slower later tries could miss.
func PollEvery(timeout, every time.Duration, cond func() error) error {
	return poll(timeout, every, every, cond)
}

func poll(timeout, first, most time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	wait := first
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait) // sleep: the pause between tries of the polling helper, bounded by the deadline
		wait = min(2*wait, most)
	}
}

type notYet struct{}

func (notYet) Error() string { return "not yet" }

func boolCond(cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return notYet{}
	}
}
