package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/testutil"
)

// TestRolloutExample runs examples/rl_rollout.py end to end, small: a
// Python base built by examples/build_debian_base.sh --from-host (the
// debootstrap base needs the network), the workspace and toolkit layers,
// episodes with reset and with create/destroy.
func TestRolloutExample(t *testing.T) {
	testutil.Require(t, testutil.Tool("python3"), testutil.File("/usr/bin/python3"), testutil.Tool("ldd"))
	s := startServer(t)
	root := testutil.RepoRoot()
	env := append(os.Environ(), "DSEC_URL="+s.URL, "DSEC_API_KEY="+s.Key, "PYTHONDONTWRITEBYTECODE=1",
		"NAME=pybase:test", "DSEC="+filepath.Join(testutil.Binaries(t), "dsec"))
	build := exec.Command("bash", filepath.Join(root, "examples", "build_debian_base.sh"), "--from-host")
	build.Env = env
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the python base: %v\n%s", err, out)
	}
	run := exec.Command("python3", filepath.Join(root, "examples", "rl_rollout.py"),
		"--base", "pybase:test", "--parallel", "2", "--episodes", "2", "--memory", "128")
	run.Env = env
	out, err := run.CombinedOutput()
	t.Logf("rl_rollout.py:\n%s", out)
	if err != nil {
		t.Fatalf("rl_rollout.py: %v", err)
	}
	// A lost episode is reported, not fatal, as in a trainer; more than one
	// of the eight means something is broken.
	lost := 0
	for _, m := range regexp.MustCompile(`, (\d+) failed`).FindAllStringSubmatch(string(out), -1) {
		n, _ := strconv.Atoi(m[1])
		lost += n
	}
	if lost > 1 {
		t.Fatalf("%d of 8 episodes failed", lost)
	}
	for _, want := range []string{"reset :", "create:", "episodes/min", "mean reward"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("output lacks %q", want)
		}
	}
	deleteAll(t, s.Client)
	testutil.RequireNoSandboxLeft(t, s)
}
