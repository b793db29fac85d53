package microvm_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend/microvm"
	"github.com/dsec-project/dsec/internal/testutil"
	"github.com/dsec-project/dsec/internal/vmlink"
)

// counterShell runs a counter in the background: /tmp/counter holds the
// last value, bumped every 100 ms by one process that lives on.
const counterShell = `i=0; while :; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.1; done`

func startCounter(t *testing.T, ag *agent.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := ag.Exec(ctx, &api.ExecRequest{Shell: counterShell, Background: true}); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, ag, 1)
}

func counter(t *testing.T, ag *agent.Client) int {
	t.Helper()
	n, err := strconv.Atoi(execOK(t, ag, "cat /tmp/counter"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitCounter waits until the counter is past n, and returns it.
func waitCounter(t *testing.T, ag *agent.Client, n int) int {
	t.Helper()
	var got int
	testutil.Eventually(t, time.Minute, fmt.Sprintf("the counter past %d", n), func() error {
		out := execOK(t, ag, "cat /tmp/counter 2>/dev/null || echo 0")
		if got, _ = strconv.Atoi(out); got <= n {
			return fmt.Errorf("the counter stays at %s", out)
		}
		return nil
	})
	return got
}

// TestForkWithMemory forks a microVM running a counter into 2 copies:
// each continues the parent's counter process (its memory came along),
// under its own host name and machine id, and the parent goes on.
func TestForkWithMemory(t *testing.T) {
	testutil.Require(t, testutil.MicroVMRequirements...)
	root := t.TempDir()
	b := newBackend(t, root, vmlink.ClientConfig{})
	id, ag := bootOne(t, b, api.Resources{CPU: 1, MemoryMB: 256, DiskMB: 256})
	startCounter(t, ag)
	execOK(t, ag, "echo parent > /root/marker")
	before := counter(t, ag)
	parentHost := execOK(t, ag, "hostname; cat /etc/machine-id 2>/dev/null || true")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	copies := []string{id + "-a", id + "-b"}
	specs, err := b.Fork(ctx, id, copies)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range copies {
			b.Destroy(context.Background(), c)
		}
	})
	if len(specs) != 2 || specs[0].ID != copies[0] {
		t.Fatalf("specs: %+v", specs)
	}
	after := counter(t, ag)
	if after < before {
		t.Fatalf("the parent's counter went back: %d then %d", before, after)
	}
	waitCounter(t, ag, after) // the parent goes on
	idents := map[string]bool{parentHost: true}
	for _, c := range copies {
		cag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, c) })
		defer cag.Close()
		got := counter(t, cag)
		if got < before {
			t.Errorf("copy %s: counter %d, below %d before the fork: not the parent's memory", c, got, before)
		}
		waitCounter(t, cag, got) // its copy of the process runs on
		if m := execOK(t, cag, "cat /root/marker"); m != "parent" {
			t.Errorf("copy %s: marker %q", c, m)
		}
		ident := execOK(t, cag, "hostname; cat /etc/machine-id; echo $DSEC_SANDBOX_ID")
		if idents[ident] {
			t.Errorf("copy %s has the identity of another: %q", c, ident)
		}
		idents[ident] = true
		if host := execOK(t, cag, "hostname"); host != c {
			t.Errorf("copy %s: hostname %q", c, host)
		}
		execOK(t, cag, "echo "+c+" > /root/marker")
		if st, err := b.State(ctx, c); err != nil || st != api.StateRunning {
			t.Errorf("copy %s: state %s, %v", c, st, err)
		}
	}
	if m := execOK(t, ag, "cat /root/marker"); m != "parent" {
		t.Errorf("the parent sees a copy's write: %q", m)
	}
	for _, c := range copies {
		if err := b.Destroy(ctx, c); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(root, "vms", c)); !os.IsNotExist(err) {
			t.Errorf("copy %s left its directory: %v", c, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(root, "vms", id, "fork-*")); len(left) > 0 {
		t.Errorf("the fork left %v", left)
	}
}

// TestHibernate pauses a microVM to disk: its VMM ends (no memory held),
// it stays hibernated across a restart of the backend, and on resume its
// processes carry on.
func TestHibernate(t *testing.T) {
	testutil.Require(t, testutil.MicroVMRequirements...)
	root := t.TempDir()
	b := newBackend(t, root, vmlink.ClientConfig{})
	id, ag := bootOne(t, b, api.Resources{CPU: 1, MemoryMB: 256, DiskMB: 256})
	startCounter(t, ag)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pidBefore := vmmPid(t, root, id)
	frozenAt := counter(t, ag)
	if err := b.Hibernate(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "vms", id, "memory.state")); err != nil {
		t.Fatalf("no saved memory: %v", err)
	}
	if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pidBefore) + "/stat"); err == nil && !strings.Contains(string(stat), ") Z ") {
		t.Fatalf("the VMM %d still runs while hibernated: %s", pidBefore, stat)
	}
	if st, err := b.State(ctx, id); err != nil || st != api.StatePaused {
		t.Fatalf("state %s, %v; want paused", st, err)
	}
	// An edge restart: a new backend over the same root adopts it as it is.
	b = newBackend(t, root, vmlink.ClientConfig{})
	specs, err := b.Recover(ctx)
	if err != nil || len(specs) != 1 {
		t.Fatalf("recover: %v %v", specs, err)
	}
	if st, err := b.State(ctx, id); err != nil || st != api.StatePaused {
		t.Fatalf("after recover: state %s, %v; want paused", st, err)
	}
	// A hibernated VM forks from its saved state, without waking.
	cp := id + "-h"
	if _, err := b.Fork(ctx, id, []string{cp}); err != nil {
		t.Fatal(err)
	}
	cag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, cp) })
	defer cag.Close()
	if n := counter(t, cag); n < frozenAt {
		t.Fatalf("the copy of a hibernated VM: counter %d, %d at the pause", n, frozenAt)
	}
	if st, err := b.State(ctx, id); err != nil || st != api.StatePaused {
		t.Fatalf("the parent after a fork while hibernated: %s, %v", st, err)
	}
	if err := b.Destroy(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if err := b.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	ag = agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
	defer ag.Close()
	n := counter(t, ag)
	if n < frozenAt {
		t.Fatalf("counter %d after resume, %d before the pause: not the same memory", n, frozenAt)
	}
	waitCounter(t, ag, n) // the same process counts on
	if _, err := os.Stat(filepath.Join(root, "vms", id, "memory.state")); !os.IsNotExist(err) {
		t.Errorf("the saved memory is kept after resume: %v", err)
	}
	if st, err := b.State(ctx, id); err != nil || st != api.StateRunning {
		t.Fatalf("state %s, %v; want running", st, err)
	}
	// Destroy with the backend that adopted it, before its leak check.
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
}

func vmmPid(t *testing.T, root, id string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "vms", id, microvm.PidFile))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(string(data[:len(data)-1]))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
