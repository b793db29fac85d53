package bench

import (
	"context"
	"errors"
	"testing"
	"time"
)

// scripted returns a sample function that reports shares in turn (the
// last one from then on) and counts its calls.
func scripted(calls *int, shares ...float64) func(context.Context) (float64, error) {
	return func(context.Context) (float64, error) {
		s := shares[min(*calls, len(shares)-1)]
		*calls++
		return s, nil
	}
}

func TestSettle(t *testing.T) {
	ctx := context.Background()
	t.Run("waits until the machine is at rest", func(t *testing.T) {
		var calls int
		_, busy, rested := settle(ctx, scripted(&calls, 0.9, 0.4, 0.16, 0.15, 0.01), 0.15, time.Hour)
		if !rested || busy != 0.15 || calls != 4 {
			t.Fatalf("settle: rested %v, busy %v after %d samples; want at rest at 0.15 after 4", rested, busy, calls)
		}
	})
	t.Run("gives up at its bound", func(t *testing.T) {
		var calls int
		_, busy, rested := settle(ctx, scripted(&calls, 0.9), 0.15, 0)
		if rested || busy != 0.9 || calls != 1 {
			t.Fatalf("settle: rested %v, busy %v after %d samples; want not at rest, 0.9, after 1", rested, busy, calls)
		}
	})
	t.Run("stops at a failed sample", func(t *testing.T) {
		calls := 0
		fail := func(context.Context) (float64, error) { calls++; return 0, errors.New("no /proc/stat") }
		if _, _, rested := settle(ctx, fail, 0.15, time.Hour); rested || calls != 1 {
			t.Fatalf("settle: rested %v after %d samples; want not at rest after 1", rested, calls)
		}
	})
	t.Run("a real sample is a share", func(t *testing.T) {
		s, err := busyShare(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s < 0 || s > 1.01 {
			t.Fatalf("busy share %v, want 0 to 1", s)
		}
	})
}
