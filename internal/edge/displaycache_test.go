package edge

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/testutil"
)

// agentBackend is a container backend whose one sandbox's agent is a test
// server on a unix socket; only what the screen's size needs is there.
type agentBackend struct {
	backend.Backend
	sock string
}

func (agentBackend) Name() string { return api.BackendContainer }

func (b agentBackend) Dial(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", b.sock)
}

func (agentBackend) Reset(context.Context, string) error { return nil }

// A GET of a sandbox asks the edge for its screen's size; the edge asks
// the sandbox's agent at most once per displayTTL, not once per GET: a
// storm of GETs is one agent call. A sandbox without a screen says so from
// the cache too; a desktop whose X server comes up late shows once the
// cache is stale, and a reset asks again at once.
func TestDisplaySizeIsNotAskedPerGet(t *testing.T) {
	var calls atomic.Int32
	var hasX atomic.Bool
	agentSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/display" {
			http.NotFound(w, r)
			return
		}
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if !hasX.Load() {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(api.ErrorResponse{Error: &api.Error{Code: api.CodeInvalid, Message: "this sandbox has no screen"}})
			return
		}
		json.NewEncoder(w).Encode(api.Display{Width: 1024, Height: 768})
	}))
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	agentSrv.Listener = l
	agentSrv.Start()
	defer agentSrv.Close()

	defer func(d time.Duration) { displayTTL = d }(displayTTL)
	displayTTL = time.Hour // nothing goes stale in this test unless it says so
	e, err := New(context.Background(), Config{NodeID: "n1", Capacity: api.Resources{CPU: 1, MemoryMB: 512},
		Load: func(context.Context) api.NodeLoad { return api.NodeLoad{} }})
	if err != nil {
		t.Fatal(err)
	}
	sb := e.newSandbox(backend.Spec{ID: "sb-1"}, agentBackend{sock: sock})
	e.mu.Lock()
	e.sandboxes["sb-1"] = sb
	e.mu.Unlock()
	h := e.Handler("")
	get := func() (api.Display, int) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/sandboxes/sb-1/display", nil))
		var d api.Display
		if rec.Code == http.StatusOK {
			if err := json.Unmarshal(rec.Body.Bytes(), &d); err != nil {
				t.Fatal(err)
			}
		}
		return d, rec.Code
	}

	for range 20 {
		if _, code := get(); code != http.StatusBadRequest {
			t.Fatalf("display of a sandbox without X: %d, want 400", code)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("20 GETs made %d agent calls, want 1", n)
	}

	hasX.Store(true) // the desktop's X server is up now
	if err := e.Reset(context.Background(), "sb-1"); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if d, code := get(); code != http.StatusOK || d != (api.Display{Width: 1024, Height: 768}) {
			t.Fatalf("display after reset: %d %+v", code, d)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("a reset and 20 GETs made %d agent calls in all, want 2", n)
	}

	hasX.Store(false) // the X server goes away: seen once the cache is stale
	displayTTL = 50 * time.Millisecond
	testutil.EventuallyTrue(t, 10*time.Second, "the display gone", func() bool {
		_, code := get()
		return code == http.StatusBadRequest
	})
}
