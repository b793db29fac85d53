package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/dsec-project/dsec/internal/testutil"
)

// compatBase is the layer the compatibility tests' sandboxes run on: bash,
// python3 and g++ copied from this host's packages by
// examples/build_sandboxfusion_base.sh --from-host (CI has no network for
// debootstrap's toolchains, and the copy is the same Debian 12 files).
const compatBase = "sfbase:test"

// TestCompat runs the client-compatibility surfaces (SandboxFusion,
// SWE-ReX, E2B) against one server and one toolchain base, built once.
func TestCompat(t *testing.T) {
	testutil.Require(t, testutil.Tool("python3"), testutil.Tool("g++"), testutil.Tool("bash"), testutil.Tool("apt-cache"))
	s := startServer(t, "--fncall-window", "1s", "--fncall-idle", "1s",
		"--sandboxfusion-layers", "base="+compatBase, "--e2b-templates", "base="+compatBase)
	build := exec.Command("bash", filepath.Join(testutil.RepoRoot(), "examples", "build_sandboxfusion_base.sh"), "--from-host")
	build.Env = append(os.Environ(), "DSEC_URL="+s.URL, "DSEC_API_KEY="+s.Key, "NAME="+compatBase,
		"DSEC="+filepath.Join(testutil.Binaries(t), "dsec"))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the toolchain base: %v\n%s", err, out)
	}
	t.Run("SandboxFusion", func(t *testing.T) { testFusion(t, s) })
	t.Run("SWE-ReX", func(t *testing.T) { testSwerexBash(t, s) })
	t.Run("E2B", func(t *testing.T) { testE2BAPI(t, s) })
	t.Run("E2BSDK", func(t *testing.T) { testE2BSDK(t, s) })
	waitNoPools(t, s.Client)
	deleteAll(t, s.Client)
	testutil.RequireNoSandboxLeft(t, s)
}

// postJSON posts a body and returns the status and the decoded answer.
func postJSON(t *testing.T, url string, hdr map[string]string, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("POST %s: %d, not a JSON object: %q", url, resp.StatusCode, b)
	}
	return resp.StatusCode, out
}
