package bench

import (
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

// ForkConfig configures `dsec bench fork`.
type ForkConfig struct {
	Client *client.Client
	Base   string
	// Copies is K; DataMB how much the parent has written (random, so
	// that neither compression nor dedup hides it).
	Copies, DataMB int
	// StoreDir is the layer store's directory (a local store), to measure
	// what reaches it; ServerPID the server whose writes to the node's
	// disk are counted (it and its reaped children: mkfs.erofs). Either
	// may be empty or 0 when the bench runs on another machine.
	StoreDir  string
	ServerPID int
	Out       io.Writer
}

// forkRun is what one way of making K copies cost.
type forkRun struct {
	total, frozen         time.Duration
	nodeBytes, storeBytes int64
}

// Fork times the fork of a container whose writable layer holds DataMB
// of changes into K copies, against the manual way in the same run: a
// snapshot, then K creates from it (as one batch). Each way starts from
// a parent of its own with its own random data, so the second does not
// find the first's chunks in the store.
func Fork(ctx context.Context, cfg ForkConfig) error {
	w, c := cfg.Out, cfg.Client
	spec := &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: cfg.Base},
		Resources: api.Resources{MemoryMB: 64, DiskMB: int64(cfg.DataMB)*2 + 256}}
	var cleanup []string
	defer func() {
		for _, id := range cleanup {
			c.DeleteSandbox(context.WithoutCancel(ctx), id)
		}
	}()
	parent := func() (string, error) {
		sb, err := c.CreateSandbox(ctx, spec)
		if err != nil {
			return "", err
		}
		cleanup = append(cleanup, sb.ID)
		fill := fmt.Sprintf("mkdir -p /data && head -c %d /dev/urandom > /data/blob && md5sum /data/blob > /data/blob.md5", cfg.DataMB<<20)
		if res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: fill, TimeoutMs: 600_000}); err != nil || res.ExitCode != 0 {
			return "", fmt.Errorf("write %d MiB into the parent: %v %+v", cfg.DataMB, err, res)
		}
		return sb.ID, nil
	}
	measure := func(run func(id string) ([]string, time.Duration, error)) (forkRun, error) {
		id, err := parent()
		if err != nil {
			return forkRun{}, err
		}
		node0, store0 := procWrites(cfg.ServerPID), storeBytes(cfg.StoreDir)
		t0 := time.Now()
		copies, frozen, err := run(id)
		cleanup = append(cleanup, copies...)
		if err != nil {
			return forkRun{}, err
		}
		r := forkRun{total: time.Since(t0), frozen: frozen}
		r.nodeBytes, r.storeBytes = procWrites(cfg.ServerPID)-node0, storeBytes(cfg.StoreDir)-store0
		// Every copy holds the parent's data; check one in full.
		for i, cp := range copies {
			check := "test -s /data/blob"
			if i == 0 {
				check = "md5sum -c /data/blob.md5"
			}
			if res, err := c.Exec(ctx, cp, &api.ExecRequest{Shell: check, TimeoutMs: 600_000}); err != nil || res.ExitCode != 0 {
				return forkRun{}, fmt.Errorf("copy %s lacks the parent's data: %v %+v", cp, err, res)
			}
		}
		return r, nil
	}

	fork, err := measure(func(id string) ([]string, time.Duration, error) {
		res, err := c.Fork(ctx, id, &api.ForkRequest{Count: cfg.Copies})
		if err != nil {
			return nil, 0, err
		}
		var ids []string
		for _, sb := range res.Sandboxes {
			ids = append(ids, sb.ID)
		}
		return ids, time.Duration(res.PausedMs) * time.Millisecond, nil
	})
	if err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	manual, err := measure(func(id string) ([]string, time.Duration, error) {
		t0 := time.Now()
		l, err := c.Snapshot(ctx, id, "")
		if err != nil {
			return nil, 0, err
		}
		frozen := time.Since(t0) // the snapshot freezes the parent throughout
		req := &api.BatchCreateRequest{Count: cfg.Copies, CreateSandboxRequest: api.CreateSandboxRequest{
			Snapshot: l.Ref, Resources: spec.Resources}}
		res, err := c.CreateBatch(ctx, req, nil)
		if err != nil {
			return nil, 0, err
		}
		var ids []string
		for _, it := range res.Items {
			if it.ID != "" {
				ids = append(ids, it.ID)
			}
			if it.Error != nil {
				return ids, 0, fmt.Errorf("create from the snapshot: %s", it.Error.Message)
			}
		}
		return ids, frozen, nil
	})
	if err != nil {
		return fmt.Errorf("snapshot + creates: %w", err)
	}

	fmt.Fprintf(w, "\nfork: a container with %d MiB of changes into %d copies\n", cfg.DataMB, cfg.Copies)
	fmt.Fprintf(w, "%-40s %14s %14s %8s\n", "measure", "snapshot+K", "fork", "ratio")
	dur := func(name string, a, b time.Duration) {
		fmt.Fprintf(w, "%-40s %14s %14s %7.2fx\n", name, ms(a), ms(b), float64(a)/float64(max(b, time.Millisecond)))
	}
	byt := func(name string, a, b int64) {
		if a < 0 || b < 0 {
			fmt.Fprintf(w, "%-40s %14s %14s\n", name, "n/a", "n/a")
			return
		}
		fmt.Fprintf(w, "%-40s %13.1fM %13.1fM %7.2fx\n", name, float64(a)/(1<<20), float64(b)/(1<<20),
			float64(a)/float64(max(b, 1)))
	}
	dur("time to all K running", manual.total, fork.total)
	dur("parent frozen", manual.frozen, fork.frozen)
	byt("written to node disk (server + children)", manual.nodeBytes, fork.nodeBytes)
	byt("layer store growth", manual.storeBytes, fork.storeBytes)
	return nil
}

// procWrites is what a process and its reaped children wrote to block
// devices (write_bytes less cancelled_write_bytes), or -1.
func procWrites(pid int) int64 {
	if pid <= 0 {
		return -1
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return -1
	}
	var wr, cancelled int64
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "write_bytes":
			wr = n
		case "cancelled_write_bytes":
			cancelled = n
		}
	}
	return wr - cancelled
}

// storeBytes is the size of the files under dir, or -1 without a dir.
func storeBytes(dir string) int64 {
	if dir == "" {
		return -1
	}
	return dirBytes(dir)
}
