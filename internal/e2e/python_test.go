package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/dsec-project/dsec/internal/testutil"
)

// TestPythonSDK runs libdsec's unittest suite (sdk/python/tests) against a
// real server, so that `go test ./...` stays the one entry point.
func TestPythonSDK(t *testing.T) {
	testutil.Require(t, testutil.Tool("python3"))
	// A profile of its own, which the suite expects beside the built-in ones.
	profiles := filepath.Join(t.TempDir(), "profiles.json")
	if err := os.WriteFile(profiles, []byte(pythonProfiles), 0o600); err != nil {
		t.Fatal(err)
	}
	// Short pool windows, so the pools the suite used are gone soon after.
	s := startServer(t, "--fncall-window", "1s", "--fncall-idle", "1s", "--profiles", profiles)
	cmd := exec.Command("python3", "-m", "unittest", "discover", "-v", "-s", "sdk/python/tests")
	cmd.Dir = testutil.RepoRoot()
	cmd.Env = append(os.Environ(), "DSEC_URL="+s.URL, "DSEC_API_KEY="+s.Key, "PYTHONDONTWRITEBYTECODE=1",
		"DSEC_TEST_PROFILE=py-grade")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil {
		t.Fatalf("libdsec tests failed: %v", err)
	}
	waitNoPools(t, s.Client)
	deleteAll(t, s.Client)
	testutil.RequireNoSandboxLeft(t, s)
}

// pythonProfiles is the --profiles file of TestPythonSDK: py-grade starts
// in "work" and the suite switches it to "grade".
const pythonProfiles = `{"py-grade": {"phase": "work", "phases": {
	"work": {"network": {"mode": "none"}, "files": {"deny": ["/grade"]}},
	"grade": {"network": {"mode": "none"}}}}}`
