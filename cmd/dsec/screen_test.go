package main

import (
	"testing"
)

func TestParseActions(t *testing.T) {
	got, err := parseActions([]string{"click", "10", "20", "right", "double-click", "1", "2", "type", "ls -l\n",
		"key", "ctrl+c", "scroll", "5", "6", "-3", "drag", "0", "0", "9", "9", "wait", "100", "move", "3", "4",
		"json", `[{"type": "key", "keys": "Return"}]`})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"click", "click", "type", "key", "scroll", "drag", "wait", "move", "key"}
	if len(got) != len(want) {
		t.Fatalf("got %d actions: %+v", len(got), got)
	}
	for i, a := range got {
		if a.Type != want[i] {
			t.Fatalf("action %d is %q, want %q", i, a.Type, want[i])
		}
	}
	if got[0].Button != "right" || *got[0].X != 10 || got[1].Count != 2 || got[4].DY != -3 || got[8].Keys != "Return" {
		t.Fatalf("fields: %+v %+v %+v", got[0], got[1], got[4])
	}
	for _, bad := range [][]string{{"click", "1"}, {"hop"}, {"type"}, {"move", "a", "b"}, {"json", "{"}} {
		if _, err := parseActions(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
