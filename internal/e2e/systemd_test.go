package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/testutil"
)

// unit is what a test needs of a systemd unit file.
type unit struct {
	env  map[string]string
	exec string            // ExecStart
	set  map[string]string // other [Service] settings
}

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{env: map[string]string{}, set: map[string]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		switch k {
		case "Environment":
			ek, ev, _ := strings.Cut(v, "=")
			u.env[ek] = ev
		case "ExecStart":
			u.exec = v
		default:
			u.set[k] = v
		}
	}
	return u
}

// argv expands ExecStart as systemd does: ${VAR} is replaced whole, $VAR
// is split on white space.
func (u unit) argv(env map[string]string) []string {
	var out []string
	for _, w := range strings.Fields(u.exec) {
		if v, ok := strings.CutPrefix(w, "$"); ok && !strings.HasPrefix(v, "{") {
			out = append(out, strings.Fields(env[v])...)
			continue
		}
		out = append(out, regexp.MustCompile(`\$\{(\w+)\}`).ReplaceAllStringFunc(w, func(m string) string {
			return env[m[2:len(m)-1]]
		}))
	}
	return out
}

// The systemd units are valid (systemd-analyze verify) and keep sandboxes:
// a stop signals the main process alone, and a restart takes the running
// sandboxes over. This machine's PID 1 is not systemd (nor is CI's), so the
// all-in-one unit is run the closest real way: its ExecStart, expanded with
// its Environment, stopped the way its KillMode says and started again the
// way its Restart says.
func TestSystemdUnits(t *testing.T) {
	testutil.Require(t, testutil.Tool("systemd-analyze"))
	testutil.Require(t, testutil.ServerRequirements...)
	bin := filepath.Join(testutil.Binaries(t), "dsec")
	units, _ := filepath.Glob(filepath.Join(testutil.RepoRoot(), "deploy", "systemd", "*.service"))
	if len(units) < 2 {
		t.Fatalf("units: %v", units)
	}
	dir := t.TempDir()
	for _, p := range units {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		local := filepath.Join(dir, filepath.Base(p))
		os.WriteFile(local, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/dsec", bin)), 0o644)
		out, err := exec.Command("systemd-analyze", "verify", local).CombinedOutput()
		if err != nil || len(out) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", filepath.Base(p), err, out)
		}
		u := readUnit(t, p)
		if u.set["KillMode"] != "process" || u.set["Restart"] != "always" {
			t.Errorf("%s: KillMode=%q Restart=%q; a stop must leave sandboxes running and a crash restart the service",
				filepath.Base(p), u.set["KillMode"], u.set["Restart"])
		}
	}

	u := readUnit(t, filepath.Join(testutil.RepoRoot(), "deploy", "systemd", "dsec.service"))
	data, err := os.MkdirTemp("", "dsec-test-data-")
	if err != nil {
		t.Fatal(err)
	}
	cgroup := "dsec-test-" + filepath.Base(data)
	env := u.env
	env["DSEC_DATA"], env["DSEC_LISTEN"] = data, "127.0.0.1:0"
	// What an operator would put in /etc/dsec/server.env on a shared test
	// machine: a cgroup parent of this test's own.
	env["DSEC_ARGS"] = fmt.Sprintf("--node-id test-node --cgroup-parent %s --microvm-kernel %s", cgroup, testutil.GuestKernelDir())
	argv := u.argv(env)
	if argv[0] != "/usr/local/bin/dsec" {
		t.Fatalf("ExecStart runs %q", argv[0])
	}
	s := testutil.StartServerCommand(t, data, cgroup, argv[1:])
	ctx := ctxT(t)
	sb := newSandbox(t, s.Client, &api.LayerRefs{Base: "base:minimal"})
	before := sh(t, s.Client, sb.ID, "echo kept > /state; cut -d' ' -f22 /proc/1/stat")

	s.Stop() // KillMode=process: SIGTERM to the server alone
	s.Restart()
	after := sh(t, s.Client, sb.ID, "cat /state; cut -d' ' -f22 /proc/1/stat")
	if after != "kept\n"+before {
		t.Fatalf("after a stop and start of the unit the sandbox holds %q, want %q (same init, same state)", after, "kept\n"+before)
	}
	if err := s.Client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
