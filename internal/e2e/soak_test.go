package e2e

import (
	"bytes"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/bench"
)

// TestSoak loads a server with buffered and streamed execs on long-lived
// sandboxes beside create/reset/destroy cycles, and checks every answer to
// the byte: output cut short under load (an answer whose connection a
// proxy dropped, a pipe read too late) fails it.
func TestSoak(t *testing.T) {
	s := startServer(t)
	var out bytes.Buffer
	err := bench.Soak(ctxT(t), bench.SoakConfig{
		Client: s.Client, Base: "base:minimal", Sandboxes: 4, Workers: 2, Churners: 2,
		Duration: 15 * time.Second, Out: &out,
	})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
}
