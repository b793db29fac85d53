package agent_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsec-project/dsec/api"
)

// followEvents follows a process's output as NDJSON events.
func (a *testAgent) followEvents(t *testing.T, id, query string) (<-chan api.OutputEvent, func()) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", fmt.Sprintf("/procs/%s/output?%s", id, query), nil)
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := a.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	ch := make(chan api.OutputEvent)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var ev api.OutputEvent
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				return
			}
			ch <- ev
		}
	}()
	return ch, func() { resp.Body.Close() }
}

func TestOutputEvents(t *testing.T) {
	a := startAgent(t)
	gate := filepath.Join(t.TempDir(), "gate")
	// Both streams, a split UTF-8 character, then it waits for the gate.
	p := a.startBackground(t, api.ExecRequest{Shell: fmt.Sprintf(
		`printf 'one\n'; printf 'err\n' >&2; printf '\303'; sleep 0.2; printf '\251\n'; while [ ! -e %s ]; do sleep 0.01; done; printf 'two\n'; exit 3`, gate)})

	events, stop := a.followEvents(t, p.ID, "follow=1")
	defer stop()
	got := map[string]string{}
	next := func() api.OutputEvent {
		t.Helper()
		ev, ok := <-events
		if !ok {
			t.Fatal("stream ended early")
		}
		if ev.Data != nil {
			if ev.Encoding != "" {
				t.Fatalf("event %+v: a character was split", ev)
			}
			if ev.Offset != int64(len(got[ev.Stream])) {
				t.Fatalf("event %+v: offset, want %d", ev, len(got[ev.Stream]))
			}
			got[ev.Stream] += *ev.Data
		}
		return ev
	}
	for got["stdout"] != "one\né\n" || got["stderr"] != "err\n" {
		next()
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for {
		ev := next()
		if ev.Exit != nil {
			if ev.Exit.ExitCode != 3 || got["stdout"] != "one\né\ntwo\n" {
				t.Fatalf("exit %+v, stdout %q", ev.Exit, got["stdout"])
			}
			break
		}
	}
	if _, ok := <-events; ok {
		t.Fatal("events after the exit")
	}

	// From an offset, one stream, not following: what is there, no exit.
	events2, stop2 := a.followEvents(t, p.ID, "stream=stdout&offset=4")
	defer stop2()
	var rest string
	for ev := range events2 {
		if ev.Exit != nil || ev.Stream != "stdout" {
			t.Fatalf("event %+v", ev)
		}
		rest += *ev.Data
	}
	if rest != "é\ntwo\n" {
		t.Fatalf("from offset 4: %q", rest)
	}

	resp, body := a.do("GET", "/procs/"+p.ID+"/output?stream=both", nil)
	wantError(t, resp, body, api.CodeInvalid)
}
