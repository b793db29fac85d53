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
