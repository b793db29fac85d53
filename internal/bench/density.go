package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// DensityConfig sets up `dsec bench density`.
type DensityConfig struct {
	Client *client.Client
	// URL is the server's address, to find its process on this host.
	URL  string
	Base string
	// Step sandboxes are added per step, by one batch create, up to Max
	// (0: until the nodes' memory or CPU limit is allocated).
	Step, Max int
	CPU       float64
	MemoryMB  int64
	// Singles create → first exec → destroy cycles and Execs warm execs on
	// random live sandboxes are timed at each step.
	Singles, Execs int
	// Pause is waited between a single's destroy and the next single's
	// create: with it, a create no longer overlaps what the previous
	// sandbox's destroy left to the kernel and the pool's refill.
	Pause time.Duration
	// Rest is the busy share of the machine's CPUs (0 to 1) under which,
	// over a second, the node counts as at rest: after each batch the
	// singles wait for it (at most restWait), as a create arriving at a
	// full node between bursts would find it. 0 does not wait.
	Rest float64
	// Empty times the singles again on the empty node after the
	// teardown, the summary's baseline next to the first step.
	Empty bool
	// BaselineN bare `runc run`s are timed at the first and at the last
	// step (0: none), in WorkDir with Runc.
	BaselineN int
	WorkDir   string
	Runc      string
	// DataDir is the node's directory of sandbox state (default: found from
	// the edge's command line).
	DataDir string
	Out     io.Writer
}

// densityRow is what one step measured.
type densityRow struct {
	live        int
	batchRate   float64
	failed      int
	first, warm stats
	// create and firstExec split first: the create request alone and the
	// first exec after it, to tell which of the two grows.
	create, firstExec stats
	hostKBPerSandbox  float64
	// kernelKBPerSandbox is the growth of the host's unreclaimable kernel
	// memory (SUnreclaim, KernelStack, PageTables, Percpu) per sandbox:
	// less noisy than MemAvailable on a machine that does other work.
	kernelKBPerSandbox float64
	// memcgKB is the mean charge of a sandbox's memory cgroup (its
	// processes' memory, their page cache and the kernel memory made
	// for them: what counts against memory_mb).
	memcgKB    int64
	agentPSSKB int64
	// containers counts the node's sandbox containers: the live ones and
	// the blanks of its pool (the sandboxes' cgroups).
	containers       int
	hostMounts       int // the host's mount table (pid 1's namespace)
	nodeMounts       int // the edge's mounts under its data directory, in its namespace
	serverKB, edgeKB int64
	runc             stats // zero when not measured at this step
	// forkExec times fork+exec of /bin/true from the bench itself: the
	// machine's own cost of a process at this step, a control for the
	// create and exec figures (on a full machine the kernel's process
	// bookkeeping, and anything else that scans the process table, is
	// slower for everyone).
	forkExec stats
	// cpuPerSingle is the machine's CPU time (all processes and the
	// kernel's workers; see busyCPU) during the singles, per single: the
	// work a create → exec → destroy costs the node, which unlike its
	// latency the hypervisor's steal does not inflate.
	cpuPerSingle time.Duration
	// settled is how long the singles waited for the machine to come to
	// rest after the batch, and restBusy its busy share when they began.
	settled      time.Duration
	restBusy     float64
	rested       bool // it came to rest within restWait
	runcMeasured bool
	runErr       error
}

// Density fills the node step by step with idle sandboxes and reports at
// each step what a new create, a warm exec and an idle sandbox cost, next
// to bare `runc run` at the first and the last step; then it destroys
// everything and checks that nothing is left. It runs on the server's
// machine, as root (it reads /proc and runs runc).
func Density(ctx context.Context, cfg DensityConfig) (err error) {
	w := cfg.Out
	nodes, err := cfg.Client.ListNodes(ctx)
	if err != nil {
		return err
	}
	max, edgeAddr := cfg.Max, ""
	room := 0
	for _, n := range nodes {
		if n.State != api.NodeUp || !slices.Contains(n.Backends, api.BackendContainer) {
			continue
		}
		edgeAddr = n.Addr
		byMem := int((n.Limit.MemoryMB - n.Allocated.MemoryMB) / cfg.MemoryMB)
		byCPU := int((n.Limit.CPU - n.Allocated.CPU) / cfg.CPU)
		room += min(byMem, byCPU)
	}
	if room <= 0 {
		return fmt.Errorf("no node has room for a sandbox with %g cpu and %d MB", cfg.CPU, cfg.MemoryMB)
	}
	if max <= 0 || max > room-1 {
		max = room - 1 // keep room for the single creates
	}
	serverPid := listenerPid(cfg.URL)
	edgePid := listenerPid(edgeAddr)
	if serverPid == 0 {
		return fmt.Errorf("no process listens at %s on this host: run the benchmark on the server's machine", cfg.URL)
	}
	dataDir := cfg.DataDir
	if dataDir == "" && edgePid > 0 {
		dataDir = dataDirOf(edgePid)
	}
	fmt.Fprintf(w, "dsec bench density: %s, cpu %g, memory_mb %d; steps of %d up to %d live; %d single creates and %d warm execs per step\n",
		cfg.Base, cfg.CPU, cfg.MemoryMB, cfg.Step, max, cfg.Singles, cfg.Execs)
	if cfg.Rest > 0 {
		fmt.Fprintf(w, "singles timed once the machine is at rest after the batch: at most %.0f%% of its CPU busy over a second (waiting at most %v)\n", cfg.Rest*100, restWait)
	}
	if cfg.Pause > 0 {
		fmt.Fprintf(w, "singles %v apart (from a destroy to the next create)\n", cfg.Pause)
	}
	fmt.Fprintf(w, "server pid %d, edge pid %d (%s), edge data %s\n\n", serverPid, edgePid, edgeNS(serverPid, edgePid), dataDir)

	spec := api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: cfg.Base},
		Resources: api.Resources{CPU: cfg.CPU, MemoryMB: cfg.MemoryMB, Pids: 64},
		Labels:    map[string]string{"bench": "density"}, Network: &api.Network{Mode: api.NetworkNone}}

	var live []string
	everMade := map[string]bool{}
	defer func() {
		if len(live) > 0 { // an early error: leave nothing behind
			destroyAll(context.WithoutCancel(ctx), cfg.Client, live)
		}
	}()
	startHostMounts, startNodeMounts := mountCount(1), mountsUnder(edgePid, dataDir)
	avail0, err := memAvailableKB()
	if err != nil {
		return err
	}
	kernel0 := kernelKB()
	var cgroupParent string // of the node's sandboxes, found at the first step

	var rows []densityRow
	header := func() {
		fmt.Fprintf(w, "%6s %9s %19s %10s %17s %9s %9s %9s %9s %9s %8s %8s %9s %9s %17s\n",
			"live", "batch/s", "create→exec p50/99", "cpu/single", "warm exec p50/99", "fork+exec", "host/sbx", "kern/sbx", "memcg", "agent PSS",
			"host mnt", "node mnt", "server", "edge", "runc run p50/99")
	}
	fmt.Fprintf(w, "host/sbx: fall of MemAvailable per live sandbox (the whole machine's); kern/sbx: rise of unreclaimable kernel\n"+
		"memory (SUnreclaim+KernelStack+PageTables+Percpu) per live sandbox; memcg: a sandbox's memory cgroup charge\n"+
		"(its processes and the kernel memory made for them), mean of up to 8; agent PSS: the same sandboxes' processes;\n"+
		"fork+exec: p50 of /bin/true run by the bench itself, the machine's own cost of a process (a control);\n"+
		"cpu/single: the machine's CPU time (all of it, kernel workers too) during the singles, per create→exec→destroy\n\n")
	// measure times a step's singles and warm execs and reads the node's
	// memory and mounts, once its pool is refilled and it is at rest.
	measure := func(row densityRow) (densityRow, error) {
		// The singles are timed on a node at rest, its blank pool
		// refilled after the batch (as bench create does).
		warmPool(ctx, cfg.Client, w)
		if cfg.Rest > 0 {
			row.settled, row.restBusy, row.rested = settle(ctx, busyShare, cfg.Rest, restWait)
		}
		if err := densityMeasure(ctx, cfg, &spec, live, everMade, &row); err != nil {
			return row, err
		}
		if len(live) > 0 {
			if avail, err := memAvailableKB(); err == nil {
				row.hostKBPerSandbox = float64(avail0-avail) / float64(len(live))
			}
			row.kernelKBPerSandbox = float64(kernelKB()-kernel0) / float64(len(live))
		}
		if cgroupParent == "" && len(live) > 0 {
			for _, pids := range sandboxProcs(map[string]bool{live[0]: true}) {
				if d := memcgDir(pids[0]); d != "" {
					cgroupParent = filepath.Dir(d)
				}
			}
		}
		if cgroupParent != "" {
			row.containers = subdirs(cgroupParent)
		}
		row.hostMounts, row.nodeMounts = mountCount(1), mountsUnder(edgePid, dataDir)
		row.serverKB = rssKB(serverPid)
		if edgePid > 0 {
			row.edgeKB = rssKB(edgePid)
		}
		if cfg.BaselineN > 0 && len(live) > 0 && (len(rows) == 0 || len(live) >= max) {
			row.runc, _, row.runErr = runcBaseline(ctx, cfg.WorkDir, cfg.Runc, cfg.BaselineN, 1)
			if row.runErr != nil {
				return row, fmt.Errorf("runc baseline: %w", row.runErr)
			}
			row.runcMeasured = true
		}
		return row, nil
	}
	header()
	for len(live) < max {
		n := min(cfg.Step, max-len(live))
		row := densityRow{}
		t0 := time.Now()
		res, berr := cfg.Client.CreateBatch(ctx, &api.BatchCreateRequest{Count: n, CreateSandboxRequest: spec}, nil)
		wall := time.Since(t0)
		if berr != nil {
			return fmt.Errorf("batch create at %d live: %w", len(live), berr)
		}
		var firstFail *api.Error
		for _, it := range res.Items {
			if it.ID != "" {
				everMade[it.ID] = true
			}
			if it.Error == nil {
				live = append(live, it.ID)
			} else {
				if it.ID != "" {
					cfg.Client.DeleteSandbox(ctx, it.ID)
				}
				if firstFail == nil {
					firstFail = it.Error
				}
			}
		}
		row.live, row.failed, row.batchRate = len(live), res.Failed, float64(res.Created)/wall.Seconds()
		if firstFail != nil {
			fmt.Fprintf(w, "  %d of the batch failed; first: %s (%s)\n", res.Failed, firstFail.Message, firstFail.Code)
		}
		if res.Created == 0 {
			break
		}
		row, err := measure(row)
		if err != nil {
			return err
		}
		rows = append(rows, row)
		printDensityRow(w, row, serverPid == edgePid)
	}
	if len(rows) == 0 {
		return errors.New("no sandbox was created")
	}

	// Teardown.
	n := len(live)
	t0 := time.Now()
	derr := destroyAll(ctx, cfg.Client, live)
	twall := time.Since(t0)
	live = nil
	fmt.Fprintf(w, "\nteardown: %d sandboxes destroyed in %.1fs (%.1f/s)\n", n, twall.Seconds(), float64(n)/twall.Seconds())
	if derr != nil {
		return fmt.Errorf("teardown: %w", derr)
	}
	var empty *densityRow
	if cfg.Empty {
		// The empty node is timed after the teardown, not before the
		// first batch: its blank pool has then grown with the demand as
		// at the steps, where a fresh server's pool of two refills after
		// every single (which cost it 3× the CPU of a single at 1,300
		// live, measured).
		row, err := measure(densityRow{})
		if err != nil {
			return err
		}
		fmt.Fprintln(w, "the empty node after the teardown:")
		header()
		printDensityRow(w, row, serverPid == edgePid)
		empty = &row
	}
	densitySummary(w, rows, empty)
	var left []string
	for i := 0; ; i++ {
		// A destroy answers when the sandbox is gone; give the kernel's
		// lazy unmounts and cgroup removal a moment all the same, and the
		// edge's trash the time to remove the directories (~4 ms each).
		if left = leftovers(everMade, edgePid, dataDir); len(left) == 0 || i == 240 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	fmt.Fprintf(w, "mounts: host %d before, %d after (the whole machine's); node %d before, %d after\n",
		startHostMounts, mountCount(1), startNodeMounts, mountsUnder(edgePid, dataDir))
	if len(left) > 0 {
		for _, l := range left[:min(len(left), 20)] {
			fmt.Fprintf(w, "  LEFT: %s\n", l)
		}
		return fmt.Errorf("%d things left behind by %d destroyed sandboxes", len(left), len(everMade))
	}
	fmt.Fprintf(w, "nothing left of %d sandboxes: no mount, cgroup, process or file names one\n", len(everMade))
	return nil
}

// densityMeasure times single creates and warm execs with the node as it
// is, and reads the agents' memory.
func densityMeasure(ctx context.Context, cfg DensityConfig, spec *api.CreateSandboxRequest, live []string, made map[string]bool, row *densityRow) error {
	var firsts, creates, execs []time.Duration
	busy0, cpuErr := busyCPU()
	for i := range cfg.Singles {
		if i > 0 && cfg.Pause > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(cfg.Pause):
			}
		}
		t0 := time.Now()
		sb, err := cfg.Client.CreateSandbox(ctx, spec)
		if err != nil {
			return fmt.Errorf("single create at %d live: %w", len(live), err)
		}
		made[sb.ID] = true
		t1 := time.Now()
		_, err = cfg.Client.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"true"}})
		firsts = append(firsts, time.Since(t0))
		creates, execs = append(creates, t1.Sub(t0)), append(execs, time.Since(t1))
		if derr := cfg.Client.DeleteSandbox(ctx, sb.ID); err == nil {
			err = derr
		}
		if err != nil {
			return fmt.Errorf("single create at %d live: %w", len(live), err)
		}
	}
	row.first, row.create, row.firstExec = summarize(firsts), summarize(creates), summarize(execs)
	if busy1, err := busyCPU(); err == nil && cpuErr == nil && cfg.Singles > 0 {
		// USER_HZ is 100 on every Linux architecture dsec runs on.
		row.cpuPerSingle = time.Duration(busy1-busy0) * 10 * time.Millisecond / time.Duration(cfg.Singles)
	}
	var forks []time.Duration
	for range max(cfg.Singles, 20) {
		t0 := time.Now()
		if err := exec.CommandContext(ctx, "/bin/true").Run(); err != nil {
			return fmt.Errorf("fork+exec of /bin/true: %w", err)
		}
		forks = append(forks, time.Since(t0))
	}
	row.forkExec = summarize(forks)
	var warm []time.Duration
	for range cfg.Execs * b2i(len(live) > 0) {
		id := live[rand.IntN(len(live))]
		t0 := time.Now()
		if _, err := cfg.Client.Exec(ctx, id, &api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return fmt.Errorf("warm exec in %s: %w", id, err)
		}
		warm = append(warm, time.Since(t0))
	}
	row.warm = summarize(warm)
	sample := map[string]bool{}
	for range min(8, len(live)) {
		sample[live[rand.IntN(len(live))]] = true
	}
	var pss, memcg, k, kcg int64
	for _, pids := range sandboxProcs(sample) {
		for _, pid := range pids {
			p, _ := processMemKB(pid)
			pss += p
		}
		k++
		if len(pids) > 0 {
			if c := memcgKB(memcgDir(pids[0])); c > 0 {
				memcg += c
				kcg++
			}
		}
	}
	if k > 0 {
		row.agentPSSKB = pss / k
	}
	if kcg > 0 {
		row.memcgKB = memcg / kcg
	}
	return nil
}

func printDensityRow(w io.Writer, r densityRow, oneProcess bool) {
	pair := func(s stats) string {
		if s == (stats{}) {
			return "-" // nothing to time: no live sandbox for a warm exec
		}
		return ms(s.p50) + "/" + ms(s.p99)
	}
	runc := "-"
	if r.runcMeasured {
		runc = pair(r.runc)
	}
	edge := mb(r.edgeKB << 10)
	if oneProcess {
		edge = "(same)"
	}
	rate, perSandbox := fmt.Sprintf("%.1f", r.batchRate), []string{"-", "-", "-", "-"}
	if r.live == 0 { // the empty node: no batch, no sandbox to divide by
		rate = "-"
	} else {
		perSandbox = []string{mibs(int64(r.hostKBPerSandbox * 1024)), mibs(int64(r.kernelKBPerSandbox * 1024)), mibs(r.memcgKB << 10), mibs(r.agentPSSKB << 10)}
	}
	fmt.Fprintf(w, "%6d %9s %19s %10s %17s %9s %9s %9s %9s %9s %8d %8d %9s %9s %17s\n",
		r.live, rate, pair(r.first), ms(r.cpuPerSingle), pair(r.warm), ms(r.forkExec.p50), perSandbox[0], perSandbox[1], perSandbox[2], perSandbox[3],
		r.hostMounts, r.nodeMounts, mb(r.serverKB<<10), edge, runc)
}

// densitySummary prints the full node against the empty one, and each
// against bare runc measured at the same step.
func densitySummary(w io.Writer, rows []densityRow, empty *densityRow) {
	first, last := rows[0], rows[len(rows)-1]
	ratio := func(a, b time.Duration) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f×", float64(a)/float64(b))
	}
	// singles compares last's singles with base's.
	singles := func(base densityRow, name string) {
		fmt.Fprintf(w, "  create→first exec p50:      %s against %s (the create alone %s → %s, %s; its first exec %s → %s, %s)\n",
			ratio(last.first.p50, base.first.p50), name, ms(base.create.p50), ms(last.create.p50), ratio(last.create.p50, base.create.p50),
			ms(base.firstExec.p50), ms(last.firstExec.p50), ratio(last.firstExec.p50, base.firstExec.p50))
		fmt.Fprintf(w, "  host CPU per single:        %s (%s → %s)\n", ratio(last.cpuPerSingle, base.cpuPerSingle), ms(base.cpuPerSingle), ms(last.cpuPerSingle))
		fmt.Fprintf(w, "  fork+exec p50 (control):    %s\n", ratio(last.forkExec.p50, base.forkExec.p50))
	}
	fmt.Fprintf(w, "\n%d live against %d live:\n", last.live, first.live)
	fmt.Fprintf(w, "  batch create rate:          %.2f×\n", last.batchRate/first.batchRate)
	if empty != nil {
		singles(*empty, "the empty node")
	}
	singles(first, fmt.Sprintf("%d live", first.live))
	fmt.Fprintf(w, "  warm exec p50:              %s\n", ratio(last.warm.p50, first.warm.p50))
	if last.settled > 0 {
		all := slices.Clone(rows)
		if empty != nil {
			all = append(all, *empty)
		}
		var waits []string
		for _, r := range all {
			wt := fmt.Sprintf("%.0fs (%.0f%%)", r.settled.Seconds(), r.restBusy*100)
			if !r.rested {
				wt += " not at rest"
			}
			waits = append(waits, wt)
		}
		fmt.Fprintf(w, "  waits for rest, busy share: %s\n", strings.Join(waits, ", "))
	}
	if last.containers > last.live {
		// The pool's blanks are in the host's figures; say what each
		// container costs as well as each live sandbox (the few blanks
		// there before the first step make it a little low).
		f := float64(last.live) / float64(last.containers)
		fmt.Fprintf(w, "  at %d live the node also holds %d blanks of its pool: %s host and %s kernel per container\n",
			last.live, last.containers-last.live, mibs(int64(last.hostKBPerSandbox*f*1024)), mibs(int64(last.kernelKBPerSandbox*f*1024)))
	}
	if first.runcMeasured && last.runcMeasured {
		fmt.Fprintf(w, "  bare runc run p50:          %s\n", ratio(last.runc.p50, first.runc.p50))
		fmt.Fprintf(w, "create→first exec p50 / bare runc run p50: %s at %d live, %s at %d live\n",
			ratio(first.first.p50, first.runc.p50), first.live, ratio(last.first.p50, last.runc.p50), last.live)
	}
}

// destroyAll destroys ids, 32 at a time.
func destroyAll(ctx context.Context, c *client.Client, ids []string) error {
	todo := make(chan string, len(ids))
	for _, id := range ids {
		todo <- id
	}
	close(todo)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range min(32, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range todo {
				if err := c.DeleteSandbox(ctx, id); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("destroy %s: %w", id, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

func edgeNS(serverPid, edgePid int) string {
	if edgePid == 0 {
		return "not on this host"
	}
	proc := "its own process"
	if edgePid == serverPid {
		proc = "the server's process"
	}
	if sameMountNS(edgePid) {
		return proc + ", host mount namespace"
	}
	return proc + ", own mount namespace"
}

// mibs is a size in MiB (the unit of memory_mb), to two places.
func mibs(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }
