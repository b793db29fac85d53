package testutil

import (
	"errors"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	n := 0
	if err := Poll(10*time.Second, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Fatalf("Poll = %v after %d calls", err, n)
	}
	want := errors.New("never")
	if err := Poll(50*time.Millisecond, func() error { return want }); err != want {
		t.Fatalf("Poll = %v, want the last error", err)
	}
}

func TestPollEvery(t *testing.T) {
	n := 0
	if err := PollEvery(10*time.Second, 2*time.Millisecond, func() error {
		if n++; n < 20 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 20 {
		t.Fatalf("PollEvery = %v after %d calls", err, n)
	}
	want := errors.New("never")
	if err := PollEvery(20*time.Millisecond, time.Millisecond, func() error { return want }); err != want {
		t.Fatalf("PollEvery = %v, want the last error", err)
	}
}
