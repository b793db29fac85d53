package server

import (
	"regexp"
	"testing"
	"time"
)

func TestSandboxIDsSortByTime(t *testing.T) {
	re := regexp.MustCompile(`^sb-[a-z2-7]{16}$`)
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	prev := ""
	seen := map[string]bool{}
	for i := range 5000 {
		id := sandboxID(t0.Add(time.Duration(i) * time.Millisecond))
		if !re.MatchString(id) {
			t.Fatalf("id %q does not look like sb- and 16 of a-z2-7", id)
		}
		if id <= prev {
			t.Fatalf("id %q made later sorts before %q", id, prev)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id], prev = true, id
	}
	same := map[string]bool{}
	for range 10000 {
		same[sandboxID(t0)] = true
	}
	if len(same) != 10000 {
		t.Fatalf("%d distinct ids of 10000 made in one millisecond", len(same))
	}
}
