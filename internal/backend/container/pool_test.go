package container

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/testutil"
)

// newTestBackend starts a backend on a fresh root with its own cgroup
// parent, removed again at the end of the test.
func newTestBackend(t *testing.T, pool PoolConfig) (*Backend, string, string) {
	t.Helper()
	return newTestBackendConfig(t, Config{Pool: pool})
}

// newTestBackendConfig is newTestBackend with more of the configuration:
// root, agent and cgroup parent are the test's.
func newTestBackendConfig(t *testing.T, cfg Config) (*Backend, string, string) {
	t.Helper()
	root := t.TempDir()
	// Two backends of one test (TestPoolMatchesCold) have two parents.
	parent := "dsec-test-" + filepath.Base(filepath.Dir(root)) + "-" + filepath.Base(root)
	cfg.Root, cfg.AgentPath, cfg.CgroupParent = root, filepath.Join(testutil.Binaries(t), "dsec-agent"), parent
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		destroyAll(b)
		b.Close()
		testutil.UnmountAll(root)
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+parent) {
			os.Remove(d)
		}
	})
	return b, root, parent
}

// destroyAll destroys the sandboxes a test left, as one that failed half
// way does: Close leaves them running (an edge's sandboxes outlive it).
func destroyAll(b *Backend) {
	b.mu.Lock()
	ids := make([]string, 0, len(b.sandboxes))
	for id := range b.sandboxes {
		ids = append(ids, id)
	}
	b.mu.Unlock()
	for _, id := range ids {
		b.Destroy(context.Background(), id)
	}
}

// waitPool waits until the pool holds n blank sandboxes.
func waitPool(t *testing.T, b *Backend, n int) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("the pool filled to %d", n), func() error {
		if st := b.PoolStats(); st.Size < n {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
}

// inside prints, from within a sandbox, everything a sandbox's creation
// decides: host name, environment, credentials and capabilities, id map
// (the host side differs: each sandbox has its own range), mounts, network
// interfaces, cgroup limits (through its cgroup namespace), rlimits and
// its file rules.
const inside = `hostname; env | sort; id; grep -E '^(Cap|Seccomp|NoNewPrivs|Uid|Gid)' /proc/self/status;
awk '{print $1, $3}' /proc/self/uid_map /proc/self/gid_map;
awk '{print $5, $6, $9}' /proc/self/mountinfo | sort; ls /sys/class/net;
for f in memory/memory.limit_in_bytes memory/memory.memsw.limit_in_bytes cpu/cpu.shares pids/pids.max; do
  echo "$f $(cat /sys/fs/cgroup/$f 2>&1)"; done; cat /proc/self/cgroup | sed 's/[0-9]*://' | sort;
ulimit -a; ls -la / /dev | awk '{print $1, $3, $4, $NF}'; touch /secret 2>&1; mkdir -p /w && echo w > /w/f && cat /w/f;
df -P / | tail -1 | awk '{print $2}'`

// outside reads, from the host, the limits on a sandbox's cgroups.
func outside(t *testing.T, b *Backend, id string) string {
	t.Helper()
	st, err := b.runc.readState(id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range []string{"memory/memory.limit_in_bytes", "memory/memory.memsw.limit_in_bytes", "cpu/cpu.shares",
		"cpu/cpu.cfs_quota_us", "cpu/cmd/cpu.cfs_quota_us", "pids/pids.max", "devices/devices.list", "/memory.max", "/pids.max"} {
		ctl, file, _ := strings.Cut(f, "/")
		dir, ok := st.CgroupPaths[ctl]
		if !ok {
			continue
		}
		v, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			v = []byte("(none)")
		}
		out = append(out, f+" "+strings.TrimSpace(string(v)))
	}
	oom, _ := os.ReadFile("/proc/" + strconv.Itoa(st.InitPid) + "/oom_score_adj")
	out = append(out, "oom_score_adj "+strings.TrimSpace(string(oom)))
	return strings.Join(out, "\n")
}

// TestPoolMatchesCold compares, field by field, a sandbox claimed from
// the pool with one created cold from the same spec: what it sees inside
// and its limits outside.
func TestPoolMatchesCold(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	base := backendtest.MinimalLayer(t, t.TempDir())
	cold, _, coldParent := newTestBackend(t, PoolConfig{})
	warm, _, warmParent := newTestBackend(t, PoolConfig{Max: 1, Min: 1})
	waitPool(t, warm, 1)
	spec := func(id string) backend.Spec {
		return backend.Spec{ID: id, Backend: api.BackendContainer, Layers: []backend.Layer{base},
			Resources: api.Resources{CPU: 0.25, MemoryMB: 48, Pids: 96, DiskMB: 32},
			Network:   api.Network{Mode: api.NetworkNone}, Env: map[string]string{"A": "1", "PATH": "/bin:/usr/bin"},
			Phase: "agent", Files: api.FileRules{Deny: []string{"/secret"}}}
	}
	const id = "sb-same"
	if err := cold.Create(ctx, spec(id)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cold.Destroy(context.Background(), id) })
	if err := warm.Create(ctx, spec(id)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { warm.Destroy(context.Background(), id) })
	if st := warm.PoolStats(); st.Claims != 1 {
		t.Fatalf("the create did not claim from the pool: %+v", st)
	}
	if got, want := shell(t, warm, id, inside), shell(t, cold, id, inside); got != want {
		t.Errorf("inside, pooled and cold differ:\n%s", lineDiff(got, want))
	}
	// Reset, both match again. (The claim kept the blank's IPC namespace,
	// runc's, whose /dev/mqueue has the host's gid 0, unmapped inside:
	// nobody; a reset of a used sandbox makes a new one, root's.)
	for _, b := range []*Backend{warm, cold} {
		if err := b.Reset(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := shell(t, warm, id, inside), shell(t, cold, id, inside); got != want {
		t.Errorf("inside, pooled and cold after a reset differ:\n%s", lineDiff(got, want))
	}
	if got, want := outside(t, warm, id), outside(t, cold, id); got != want {
		t.Errorf("outside, pooled and cold differ:\n%s", lineDiff(got, want))
	}
	// Its cgroups are named as a cold create names them: the v1 ones are
	// renamed at the claim; a cgroup2 one cannot be and keeps the blank's.
	coldSt, err := cold.runc.readState(id)
	if err != nil {
		t.Fatal(err)
	}
	warmSt, err := warm.runc.readState(id)
	if err != nil {
		t.Fatal(err)
	}
	for ctl, want := range coldSt.CgroupPaths {
		got := strings.Replace(warmSt.CgroupPaths[ctl], "/"+warmParent+"/", "/"+coldParent+"/", 1)
		if isCgroup2(want) {
			if !strings.HasPrefix(filepath.Base(got), poolPrefix) || filepath.Dir(got) != filepath.Dir(want) {
				t.Errorf("cgroup2 %q: pooled %s, cold %s", ctl, warmSt.CgroupPaths[ctl], want)
			}
			continue
		}
		if got != want {
			t.Errorf("cgroup %q: pooled %s, cold %s", ctl, warmSt.CgroupPaths[ctl], want)
		}
		if _, err := os.Stat(warmSt.CgroupPaths[ctl]); err != nil {
			t.Errorf("cgroup %q of the pooled sandbox: %v", ctl, err)
		}
	}
	if len(warmSt.CgroupPaths) != len(coldSt.CgroupPaths) {
		t.Errorf("cgroups: pooled %v, cold %v", warmSt.CgroupPaths, coldSt.CgroupPaths)
	}
	for _, b := range []*Backend{warm, cold} {
		if st, err := b.State(ctx, id); err != nil || st != api.StateRunning {
			t.Errorf("state %q, %v", st, err)
		}
		if err := b.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		if st, _ := b.State(ctx, id); st != api.StatePaused {
			t.Errorf("after pause: state %q", st)
		}
		if err := b.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPoolLeavesNothing: claimed and blank sandboxes alike are gone, with
// every mount, cgroup, process and file, once destroyed and the backend
// closed; and a second create of a live id is refused without using up
// a blank.
func TestPoolLeavesNothing(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	base := backendtest.MinimalLayer(t, t.TempDir())
	b, root, parent := newTestBackend(t, PoolConfig{Max: 3, Min: 3})
	waitPool(t, b, 3)
	spec := backend.Spec{ID: "sb-leak", Backend: api.BackendContainer, Layers: []backend.Layer{base},
		Resources: api.Resources{CPU: 0.5, MemoryMB: 32, DiskMB: 16}, Network: api.Network{Mode: api.NetworkNone}}
	if err := b.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if out := shell(t, b, spec.ID, "echo x > /x; cat /x; hostname"); out != "x\nsb-leak\n" {
		t.Fatalf("claimed sandbox: %q", out)
	}
	if err := b.Create(ctx, spec); err == nil {
		t.Fatal("a second create of a live id succeeded")
	}
	if err := b.Reset(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if out := shell(t, b, spec.ID, "cat /x 2>/dev/null; hostname"); out != "sb-leak\n" {
		t.Fatalf("after reset: %q", out)
	}
	if err := b.Destroy(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	st := b.PoolStats()
	if st.Claims != 1 {
		t.Errorf("claims %d, want 1: %+v", st.Claims, st)
	}
	if got := startNSMounts(t, b, root); len(got) != 0 {
		t.Errorf("mounts in the start namespace: %v", got)
	}
	b.Close()
	for _, leak := range leaks(t, b, root, parent) {
		t.Error("leaked:", leak)
	}
}

// TestPoolClaimFallsBackCold: a claim that cannot rename the blank's
// cgroups to the sandbox's name (a cgroup of that name is left on the
// node) does not fail the create: the blank is torn down and the sandbox
// starts cold, and nothing of either is left once it is destroyed.
func TestPoolClaimFallsBackCold(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	base := backendtest.MinimalLayer(t, t.TempDir())
	b, root, parent := newTestBackend(t, PoolConfig{Max: 1, Min: 1})
	waitPool(t, b, 1)
	b.pool.mu.Lock()
	blank := b.pool.ready[0].Spec.ID
	b.pool.mu.Unlock()
	st, err := b.runc.readState(blank)
	if err != nil {
		t.Fatal(err)
	}
	var v1 string
	for ctl, dir := range st.CgroupPaths {
		if ctl != "" && !isCgroup2(dir) {
			v1 = filepath.Join(filepath.Dir(dir), "sb-taken")
			break
		}
	}
	if v1 == "" {
		t.Skip("no cgroup v1 hierarchy: claims rename no cgroup") // cgroup2 only: nothing to collide
	}
	if err := os.Mkdir(v1, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(v1) })
	spec := backend.Spec{ID: "sb-taken", Backend: api.BackendContainer, Layers: []backend.Layer{base},
		Resources: api.Resources{MemoryMB: 32}, Network: api.Network{Mode: api.NetworkNone}}
	if err := b.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if ps := b.PoolStats(); ps.Claims != 0 || ps.Misses != 1 {
		t.Errorf("want the claim counted as a miss: %+v", ps)
	}
	if out := shell(t, b, spec.ID, "hostname"); out != "sb-taken\n" {
		t.Fatalf("cold sandbox: %q", out)
	}
	if err := b.Destroy(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	b.Close()
	for _, leak := range leaks(t, b, root, parent) {
		t.Error("leaked:", leak)
	}
}

// threadPolicies lists the distinct scheduling policies and nice values
// ("policy/nice") of process pid's threads.
func threadPolicies(t *testing.T, pid int) []string {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		if attr, err := unix.SchedGetAttr(tid, 0); err == nil {
			if p := fmt.Sprintf("%d/%d", attr.Policy, attr.Nice); !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestPoolBlankInBackground: a blank sandbox runs at backgroundNice at the
// least CPU weight; the claim gives its agent the normal policy and the
// cgroup the weight of a create that asked for no CPU (the kernel's
// default), so commands run as in a cold sandbox; and the claimed agent,
// never used, serves on as the same process (no re-exec), while a reset
// of a used one re-executes.
func TestPoolBlankInBackground(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	base := backendtest.MinimalLayer(t, t.TempDir())
	b, _, _ := newTestBackend(t, PoolConfig{Max: 1, Min: 1})
	waitPool(t, b, 1)
	b.pool.mu.Lock()
	blank := b.pool.ready[0].Spec.ID
	b.pool.mu.Unlock()
	st, err := b.runc.readState(blank)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := threadPolicies(t, st.InitPid), []string{fmt.Sprintf("%d/%d", unix.SCHED_NORMAL, backgroundNice)}; !slices.Equal(got, want) {
		t.Errorf("blank's agent: policy/nice %v, want %v", got, want)
	}
	shares := func(st containerState) string {
		dir, ok := st.CgroupPaths["cpu"]
		if !ok {
			return "(no cpu cgroup v1)"
		}
		v, err := os.ReadFile(filepath.Join(dir, "cpu.shares"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(v))
	}
	if got := shares(st); got != "2" && got != "(no cpu cgroup v1)" {
		t.Errorf("blank's cpu.shares %s, want 2", got)
	}
	instance := func(id string) string {
		ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
		defer ag.Close()
		h, err := ag.Health(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return h.Instance
	}
	before := instance(blank)

	spec := backend.Spec{ID: "sb-fg", Backend: api.BackendContainer, Layers: []backend.Layer{base},
		Resources: api.Resources{MemoryMB: 32}, Network: api.Network{Mode: api.NetworkNone}}
	if err := b.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), spec.ID) })
	if ps := b.PoolStats(); ps.Claims != 1 {
		t.Fatalf("the create did not claim the blank: %+v", ps)
	}
	if got := instance(spec.ID); got != before {
		t.Errorf("the unused agent was replaced at the claim: instance %s, was %s", got, before)
	}
	// The kept agent's file requests resolve beneath the new root (not
	// the blank's read-only one).
	ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, spec.ID) })
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://agent/files?path=/w/put", strings.NewReader("put\n"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ag.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ag.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("PUT /files in the claimed sandbox: %s: %s", resp.Status, msg)
	}
	if out := shell(t, b, spec.ID, "cat /w/put"); out != "put\n" {
		t.Errorf("the file the agent wrote: %q", out)
	}
	st, err = b.runc.readState(spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := threadPolicies(t, st.InitPid), []string{fmt.Sprintf("%d/0", unix.SCHED_NORMAL)}; !slices.Equal(got, want) {
		t.Errorf("claimed agent: policy/nice %v, want %v", got, want)
	}
	if got := shares(st); got != "1024" && got != "(no cpu cgroup v1)" {
		t.Errorf("claimed cpu.shares %s, want the default 1024", got)
	}
	if out := shell(t, b, spec.ID, "grep -E '^policy' /proc/self/sched; cut -d' ' -f19 /proc/self/stat"); strings.Join(strings.Fields(out), " ") != "policy : 0 0" {
		t.Errorf("a command's scheduling: %q, want policy 0 (SCHED_NORMAL), nice 0", out)
	}
	// Used now (an exec): a reset re-executes it.
	if err := b.Reset(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if got := instance(spec.ID); got == before {
		t.Errorf("a used agent was kept by a reset: instance %s", got)
	}
}

// TestPoolBlankCommandsQuota: a blank is started with its commands' CPU
// cgroup made, with the quota of the last create (so that a claim of the
// same request writes no bandwidth file), and a claim of another request
// gets its own.
func TestPoolBlankCommandsQuota(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	base := backendtest.MinimalLayer(t, t.TempDir())
	b, _, _ := newTestBackend(t, PoolConfig{Max: 1, Min: 1})
	waitPool(t, b, 1)
	blankCPU := func() string {
		t.Helper()
		b.pool.mu.Lock()
		blank := b.pool.ready[0].Spec.ID
		b.pool.mu.Unlock()
		st, err := b.runc.readState(blank)
		if err != nil {
			t.Fatal(err)
		}
		return st.CgroupPaths["cpu"]
	}
	if blankCPU() == "" {
		if testutil.InCI() {
			t.Fatal("no cpu cgroup v1")
		}
		t.Skip("no cpu cgroup v1")
	}
	if _, err := os.Stat(filepath.Join(blankCPU(), cmdCgroup)); !os.IsNotExist(err) {
		t.Errorf("a blank before any create has a commands' cgroup: %v", err)
	}
	quota := func(dir string) string {
		t.Helper()
		var out []string
		for _, f := range []string{"cpu.cfs_quota_us", "cpu.cfs_burst_us", "tasks"} {
			out = append(out, readTrim(t, filepath.Join(dir, cmdCgroup, f)))
		}
		return strings.Join(out, " ")
	}
	create := func(id string, cpu float64) string {
		t.Helper()
		spec := backend.Spec{ID: id, Backend: api.BackendContainer, Layers: []backend.Layer{base},
			Resources: api.Resources{CPU: cpu, MemoryMB: 32}, Network: api.Network{Mode: api.NetworkNone}}
		if err := b.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Destroy(context.Background(), id) })
		st, err := b.runc.readState(id)
		if err != nil {
			t.Fatal(err)
		}
		return st.CgroupPaths["cpu"]
	}
	create("sb-q1", 0.05)
	waitPool(t, b, 1)
	if got := quota(blankCPU()); got != "5000 5000 " {
		t.Errorf("the next blank's commands' cgroup: quota, burst, tasks %q, want %q", got, "5000 5000 ")
	}
	dir := create("sb-q2", 0.2)
	if ps := b.PoolStats(); ps.Claims != 2 {
		t.Fatalf("the creates did not claim blanks: %+v", ps)
	}
	waitPool(t, b, 1)
	if got := quota(blankCPU()); got != "20000 20000 " {
		t.Errorf("the blank after a create of cpu 0.2: quota, burst, tasks %q", got)
	}
	// A create without a CPU request has no commands' CPU cgroup, as a
	// cold one.
	dir3 := create("sb-q3", 0)
	if ps := b.PoolStats(); ps.Claims != 3 {
		t.Fatalf("the create without a CPU request did not claim a blank: %+v", ps)
	}
	if _, err := os.Stat(filepath.Join(dir3, cmdCgroup)); !os.IsNotExist(err) {
		t.Errorf("a claim without a CPU request has a commands' cpu cgroup: %v", err)
	}
	shell(t, b, "sb-q2", "sleep 60 >/dev/null 2>&1 &")
	if got := quota(dir); !strings.HasPrefix(got, "20000 20000 ") || strings.TrimPrefix(got, "20000 20000 ") == "" {
		t.Errorf("a claim of cpu 0.2 from a blank made for 0.05: quota, burst, tasks %q, want 20000 20000 and its command", got)
	}
}

// lineDiff lists the lines only one of got (+) and want (-) has.
func lineDiff(got, want string) string {
	count := map[string]int{}
	for _, l := range strings.Split(got, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(want, "\n") {
		count[l]--
	}
	var out []string
	for l, n := range count {
		switch {
		case n > 0:
			out = append(out, "+ "+l)
		case n < 0:
			out = append(out, "- "+l)
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// TestPoolFollowsDemand: the pool's target is the eligible creates of the
// last window, between its minimum and maximum; takes from an empty pool
// are misses.
func TestPoolFollowsDemand(t *testing.T) {
	p := newPool(PoolConfig{Max: 5, Min: 2, Window: time.Minute})
	now := time.Now()
	if got := p.target(now); got != 2 {
		t.Fatalf("target without demand %d, want the minimum 2", got)
	}
	for range 3 {
		if p.take() != nil {
			t.Fatal("an empty pool handed out a sandbox")
		}
	}
	if st := (&Backend{pool: p}).PoolStats(); st.Misses != 3 || st.Target != 3 || st.Max != 5 {
		t.Fatalf("after 3 creates: %+v", st)
	}
	for range 10 {
		p.take()
	}
	if got := p.target(now); got != 5 {
		t.Fatalf("target after 13 creates %d, want the maximum 5", got)
	}
	if got := p.target(now.Add(2 * time.Minute)); got != 2 {
		t.Fatalf("target a window later %d, want the minimum 2", got)
	}
	rec := &record{Spec: backend.Spec{ID: poolPrefix + "x"}}
	p.put(rec)
	if got := p.take(); got != rec {
		t.Fatalf("take after put: %v", got)
	}
	if p := newPool(PoolConfig{Max: 1, Min: 4}); p.cfg.Min != 1 || p.cfg.Window != time.Minute {
		t.Fatalf("config not bounded: %+v", p.cfg)
	}
}

// TestClaimedRootCoversTheBlanks: a claim mounts the new root over the
// blank's and chroots (no pivot_root, which walks every thread of the
// host). A tenant that climbs out of a chroot with ".." must still land
// in its own root, before and after a reset, never in the blank's
// (runtime layer) root beneath.
func TestClaimedRootCoversTheBlanks(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"), testutil.Tool("go"))
	ctx := context.Background()
	climb := filepath.Join(t.TempDir(), "climb")
	build := exec.Command("go", "build", "-o", climb, "./testdata/climb")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build climb: %v\n%s", err, out)
	}
	prog, err := os.ReadFile(climb)
	if err != nil {
		t.Fatal(err)
	}
	base := backendtest.MinimalLayer(t, t.TempDir())
	b, _, _ := newTestBackend(t, PoolConfig{Max: 1, Min: 1})
	waitPool(t, b, 1)
	spec := backend.Spec{ID: "sb-climb", Backend: api.BackendContainer, Layers: []backend.Layer{base},
		Resources: api.Resources{MemoryMB: 32}, Network: api.Network{Mode: api.NetworkNone}}
	if err := b.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), spec.ID) })
	if ps := b.PoolStats(); ps.Claims != 1 {
		t.Fatalf("the create did not claim the blank: %+v", ps)
	}
	for _, when := range []string{"claimed", "reset"} {
		ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, spec.ID) })
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://agent/files?path=/bin/climb&mode=755", bytes.NewReader(prog))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := ag.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ag.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("%s: PUT /files: %s: %s", when, resp.Status, msg)
		}
		shell(t, b, spec.ID, "touch /only-here")
		own := shell(t, b, spec.ID, "ls -A / | sort")
		if !strings.Contains(own, "only-here\n") {
			t.Fatalf("%s: the sandbox's root: %q", when, own)
		}
		if got := shell(t, b, spec.ID, "/bin/climb 2>&1 | sort"); got != own {
			t.Errorf("%s: climbing out of a chroot reached another root:\n%s", when, lineDiff(got, own))
		}
		if err := b.Reset(ctx, spec.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCPUShares: a sandbox's weight is its request, never below the
// kernel's default (cpuShares).
func TestCPUShares(t *testing.T) {
	for _, c := range []struct {
		cpu  float64
		want int64
	}{{0.05, 1024}, {0.5, 1024}, {1, 1024}, {2, 2048}, {2.5, 2560}} {
		if got := cpuShares(c.cpu); got != c.want {
			t.Errorf("cpuShares(%g) = %d, want %d", c.cpu, got, c.want)
		}
	}
}
