package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// ForkVMConfig configures `dsec bench fork --backend microvm`.
type ForkVMConfig struct {
	Client *client.Client
	Base   string
	// Copies is K; MemoryMB the guest's RAM, FillMB how much of it the
	// parent fills (tmpfs) before the fork and the hibernation.
	Copies           int
	MemoryMB, FillMB int64
	Out              io.Writer
}

// ForkVM times the fork of a microVM running a counter into K copies that
// carry its memory and processes (time to all K running; each copy's
// counter is checked to go on from the fork point), against K fresh
// creates (a batch) in the same run; then a hibernation of the parent:
// pause to disk and resume times, and its VMM's RSS before, while and
// after (read from /proc when the bench runs on the node).
func ForkVM(ctx context.Context, cfg ForkVMConfig) error {
	w, c := cfg.Out, cfg.Client
	spec := &api.CreateSandboxRequest{Backend: api.BackendMicroVM, Layers: &api.LayerRefs{Base: cfg.Base},
		Resources: api.Resources{CPU: 1, MemoryMB: cfg.MemoryMB, DiskMB: 1024}}
	var cleanup []string
	defer func() {
		for _, id := range cleanup {
			c.DeleteSandbox(context.WithoutCancel(ctx), id)
		}
	}()
	exec := func(id, shell string) (string, error) {
		res, err := c.Exec(ctx, id, &api.ExecRequest{Shell: shell, TimeoutMs: 600_000})
		if err != nil {
			return "", err
		}
		if res.ExitCode != 0 {
			return "", fmt.Errorf("%s in %s: exit %d: %s", shell, id, res.ExitCode, res.Stderr)
		}
		return strings.TrimSpace(res.Stdout), nil
	}
	counter := func(id string) (int, error) {
		out, err := exec(id, "cat /tmp/n")
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(out)
	}
	// countsOn waits until the counter in id is past n.
	countsOn := func(id string, n int) error {
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			got, err := counter(id)
			if err == nil && got > n {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("sandbox %s: the counter stays at %d (%v)", id, got, err)
			}
		}
	}

	t0 := time.Now()
	parent, err := c.CreateSandbox(ctx, spec)
	if err != nil {
		return err
	}
	cleanup = append(cleanup, parent.ID)
	boot := time.Since(t0)
	if _, err := c.Exec(ctx, parent.ID, &api.ExecRequest{Background: true,
		Shell: `i=0; while :; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.1; done`}); err != nil {
		return err
	}
	if cfg.FillMB > 0 {
		if _, err := exec(parent.ID, fmt.Sprintf("mkdir -p /dev/shm && head -c %d /dev/urandom > /dev/shm/fill", cfg.FillMB<<20)); err != nil {
			return err
		}
	}
	if err := countsOn(parent.ID, 0); err != nil {
		return err
	}
	before, err := counter(parent.ID)
	if err != nil {
		return err
	}

	t0 = time.Now()
	res, err := c.Fork(ctx, parent.ID, &api.ForkRequest{Count: cfg.Copies})
	if err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	forkTime := time.Since(t0)
	hosts := map[string]bool{}
	for _, sb := range res.Sandboxes {
		cleanup = append(cleanup, sb.ID)
		n, err := counter(sb.ID)
		if err != nil {
			return err
		}
		if n < before {
			return fmt.Errorf("copy %s: counter %d, below %d before the fork: memory not carried", sb.ID, n, before)
		}
		if err := countsOn(sb.ID, n); err != nil {
			return err
		}
		h, err := exec(sb.ID, "hostname; cat /etc/machine-id")
		if err != nil {
			return err
		}
		if hosts[h] {
			return fmt.Errorf("copy %s shares its identity %q", sb.ID, h)
		}
		hosts[h] = true
	}
	for _, sb := range res.Sandboxes {
		c.DeleteSandbox(ctx, sb.ID)
	}

	t0 = time.Now()
	batch, err := c.CreateBatch(ctx, &api.BatchCreateRequest{Count: cfg.Copies, CreateSandboxRequest: *spec}, nil)
	if err != nil {
		return fmt.Errorf("fresh creates: %w", err)
	}
	freshTime := time.Since(t0)
	for _, it := range batch.Items {
		if it.ID != "" {
			cleanup = append(cleanup, it.ID)
			c.DeleteSandbox(ctx, it.ID)
		}
		if it.Error != nil {
			return fmt.Errorf("fresh create: %s", it.Error.Message)
		}
	}

	pid := vmmPid(parent.ID)
	rssBefore := vmmRSSKB(pid)
	t0 = time.Now()
	if _, err := c.Hibernate(ctx, parent.ID); err != nil {
		return fmt.Errorf("hibernate: %w", err)
	}
	hibTime := time.Since(t0)
	rssWhile := vmmRSSKB(pid)
	if vmmPid(parent.ID) > 0 {
		rssWhile = vmmRSSKB(vmmPid(parent.ID))
	}
	t0 = time.Now()
	if _, err := c.Resume(ctx, parent.ID); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	if _, err := exec(parent.ID, "true"); err != nil {
		return err
	}
	wakeTime := time.Since(t0)
	rssAfter := vmmRSSKB(vmmPid(parent.ID))
	n, err := counter(parent.ID)
	if err != nil {
		return err
	}
	if err := countsOn(parent.ID, n); err != nil {
		return fmt.Errorf("after resume: %w", err)
	}

	fmt.Fprintf(w, "\nfork of a microVM (%d MB RAM, %d MB filled, counter running) into %d copies\n", cfg.MemoryMB, cfg.FillMB, cfg.Copies)
	fmt.Fprintf(w, "%-46s %12s\n", "measure", "value")
	fmt.Fprintf(w, "%-46s %12s\n", "parent boot (create)", ms(boot))
	fmt.Fprintf(w, "%-46s %12s\n", "fork: time to all K running (memory carried)", ms(forkTime))
	fmt.Fprintf(w, "%-46s %12s\n", "K fresh creates (batch, boot, no memory)", ms(freshTime))
	fmt.Fprintf(w, "%-46s %12s\n", "hibernate (pause, memory to disk)", ms(hibTime))
	fmt.Fprintf(w, "%-46s %12s\n", "resume from disk, to first exec", ms(wakeTime))
	kb := func(name string, v int64) {
		if v < 0 {
			fmt.Fprintf(w, "%-46s %12s\n", name, "n/a")
			return
		}
		fmt.Fprintf(w, "%-46s %11.1fM\n", name, float64(v)/1024)
	}
	kb("VMM RSS before hibernate", rssBefore)
	kb("VMM RSS while hibernated", rssWhile)
	kb("VMM RSS after resume", rssAfter)
	return nil
}

// vmmPid finds the QEMU process of a sandbox on this machine (its -name
// is guest=dsec-<id>), or 0.
func vmmPid(id string) int {
	want := []byte("guest=dsec-" + id + "\x00")
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmd, want) {
			return pid
		}
	}
	return 0
}

// vmmRSSKB is a process's resident set in KiB: 0 if it is gone, -1 if it
// was never found (the bench runs elsewhere).
func vmmRSSKB(pid int) int64 {
	if pid <= 0 {
		return -1
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
