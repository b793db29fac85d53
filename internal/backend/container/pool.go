package container

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/idmap"
)

// PoolConfig sizes the node's pool of blank sandboxes: containers started
// ahead of demand — namespaces, cgroups, id range and agent — on a
// read-only root that holds nothing but the runtime layer. A create
// claims one and gives it its layers by the same in-place root switch a
// reset uses (resetInPlace), so that it costs about a reset instead of a
// `runc run`, whatever its layers. Like FnCall's pools, the pool refills
// toward the creates it served in the last Window, between Min and Max.
type PoolConfig struct {
	// Max bounds the blank sandboxes kept; 0 turns the pool off.
	Max int
	// Min is kept warm even without demand.
	Min int
	// Window is how far back demand is counted; 1 minute by default.
	Window time.Duration
}

// PoolStats describes the pool, for the node's report and metrics.
type PoolStats = api.BlankPool

// poolPrefix names blank sandboxes; no tenant sandbox id has it (ids are
// the server's "sb-…").
const poolPrefix = "pool-"

type pool struct {
	cfg PoolConfig

	mu       sync.Mutex
	ready    []*record
	starting int
	demand   []time.Time // eligible creates, oldest first, within Window
	claims   uint64
	misses   uint64
	// diskMB is the writable layer size blanks make ahead: the last
	// eligible create's (the node's default until one came).
	diskMB int64
	// cpu is the CPU request whose commands' cgroup blanks make ahead:
	// the last eligible create's (none until one came).
	cpu float64

	// owned holds the ids of the blank sandboxes this pool made and still
	// holds (starting or ready), for Recover to leave alone.
	owned sync.Map

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

func newPool(cfg PoolConfig) *pool {
	if cfg.Window <= 0 {
		cfg.Window = time.Minute
	}
	cfg.Min = min(max(cfg.Min, 0), cfg.Max)
	return &pool{cfg: cfg, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// target is what the pool refills toward: the eligible creates of the
// last window, between Min and Max. Preconditions: p.mu held.
func (p *pool) target(now time.Time) int {
	cut := 0
	for cut < len(p.demand) && now.Sub(p.demand[cut]) > p.cfg.Window {
		cut++
	}
	p.demand = p.demand[cut:]
	return min(max(len(p.demand), p.cfg.Min), p.cfg.Max)
}

func (p *pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take counts an eligible create and hands it a blank sandbox, or nil.
func (p *pool) take() *record {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.demand = append(p.demand, time.Now())
	if len(p.demand) > 4*p.cfg.Max+64 { // only the newest Max count
		p.demand = append(p.demand[:0], p.demand[len(p.demand)-p.cfg.Max:]...)
	}
	defer p.poke()
	if n := len(p.ready); n > 0 {
		rec := p.ready[n-1] // the newest: its pages are the warmest
		p.ready = p.ready[:n-1]
		return rec
	}
	p.misses++
	return nil
}

func (p *pool) put(rec *record) {
	p.mu.Lock()
	p.ready = append(p.ready, rec)
	p.mu.Unlock()
}

func (p *pool) count(claimed bool) {
	p.mu.Lock()
	if claimed {
		p.claims++
	} else {
		p.misses++
	}
	p.mu.Unlock()
}

// PoolStats reports the pool; all zero when it is off.
func (b *Backend) PoolStats() PoolStats {
	p := b.pool
	if p == nil {
		return PoolStats{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{Size: len(p.ready), Target: p.target(time.Now()), Max: p.cfg.Max, Claims: p.claims, Misses: p.misses}
}

// refillParallel is how many blank sandboxes the pool starts at a time.
// A start is a `runc run`: a burst of them would slow the creates the pool
// is there to speed up; one at a time could not keep up with a node's
// sequential creates (each consumes a blank in about a reset's time while
// a start takes a `runc run`'s).
const refillParallel = 2

// refillQuiet is how long after the last create the pool waits before it
// starts blanks, as long as it holds at least a quarter of its target
// (holdFor).
const refillQuiet = 300 * time.Millisecond

// holdFor says how long the refill should wait before starting a blank:
// while creates come one after another and the pool still holds a
// quarter of its target, a refill's `runc run` would only compete with
// them (for CPU, and for the kernel's mount and cgroup locks, which a
// start at a low priority takes too) — the pool is there to absorb a run of
// creates and refill in the pause after it. Below a quarter it refills at
// once. Preconditions: p.mu held.
func (p *pool) holdFor(now time.Time) time.Duration {
	if len(p.demand) == 0 {
		return 0
	}
	low := max(1, p.target(now)/4)
	if len(p.ready)+p.starting < low {
		return 0
	}
	if since := now.Sub(p.demand[len(p.demand)-1]); since < refillQuiet {
		return refillQuiet - since
	}
	return 0
}

// refill keeps the pool at its target, refillParallel blank sandboxes at
// a time, and lets surplus blanks go once demand falls.
func (b *Backend) refill() {
	p := b.pool
	defer close(p.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var starts sync.WaitGroup
	defer starts.Wait() // Close waits for the starts under way
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-p.done:
		}
	}()
	tick := time.NewTicker(max(p.cfg.Window/8, time.Second))
	defer tick.Stop()
	var failures atomic.Int32
	var hold time.Duration // the refill waits for creates to pause
	start := func() {
		defer starts.Done()
		defer p.poke() // the loop looks again: more to start, or a failure
		// Not cut short by Close: a runc run killed half way would
		// leave a container runc has no state for. Close waits.
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		rec, err := b.startBlank(sctx)
		scancel()
		p.mu.Lock()
		p.starting--
		if err == nil {
			p.ready = append(p.ready, rec)
		}
		p.mu.Unlock()
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn("pool: start a blank sandbox", "err", err, "failures", failures.Add(1))
			}
			return
		}
		failures.Store(0)
	}
	for {
		hold = 0
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			p.mu.Lock()
			need := p.target(time.Now()) - len(p.ready) - p.starting
			var surplus *record
			if need < 0 && len(p.ready) > 0 {
				surplus = p.ready[0] // the oldest
				p.ready = p.ready[1:]
			}
			// After a failure, one start at a time until one succeeds.
			par := refillParallel
			if failures.Load() > 0 {
				par = 1
			}
			startOne := need > 0 && p.starting < par
			if startOne {
				if hold = p.holdFor(time.Now()); hold > 0 {
					startOne = false
				}
			}
			if startOne {
				p.starting++
			}
			p.mu.Unlock()
			if surplus != nil {
				b.teardown(context.WithoutCancel(ctx), surplus.Spec.ID, surplus)
				p.owned.Delete(surplus.Spec.ID)
				continue
			}
			if !startOne {
				break
			}
			starts.Add(1)
			go start()
		}
		var resume <-chan time.Time
		if hold > 0 {
			resume = time.After(hold)
		}
		select {
		case <-p.stop:
			return
		case <-resume:
		case <-p.wake:
			if failures.Load() > 0 {
				// Not in a tight loop: again at the next tick.
				select {
				case <-p.stop:
					return
				case <-tick.C:
				}
			}
		case <-tick.C:
		}
	}
}

// drainPool stops the refill and tears every blank sandbox down.
func (b *Backend) drainPool() {
	p := b.pool
	if p == nil {
		return
	}
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	// A few at a time: a full pool (32) torn down one by one on a busy
	// node would hold a SIGTERM'd server up for many seconds.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, rec := range ready {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := b.teardown(context.Background(), rec.Spec.ID, rec); err != nil {
				b.log.Warn("pool: tear down a blank sandbox", "sandbox", rec.Spec.ID, "err", err)
			}
			p.owned.Delete(rec.Spec.ID)
		}()
	}
	wg.Wait()
}

// startBlank starts a blank sandbox: the container a cold create would
// start, with no limits yet and a read-only root of the runtime layer
// alone, its agent serving.
func (b *Backend) startBlank(ctx context.Context) (rec *record, err error) {
	var r [8]byte
	rand.Read(r[:])
	id := poolPrefix + hex.EncodeToString(r[:])
	b.pool.owned.Store(id, true)
	defer func() {
		if err != nil {
			b.pool.owned.Delete(id)
		}
	}()
	dir := b.dir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("blank sandbox: %w", err)
	}
	rec = &record{Spec: backend.Spec{ID: id, Network: api.Network{Mode: api.NetworkNone}}}
	defer func() {
		if err != nil {
			b.teardown(context.WithoutCancel(ctx), id, rec)
		}
	}()
	if rec.UIDs, err = b.allocUIDs(id); err != nil {
		return nil, err
	}
	if err := os.Chown(dir, 0, int(rec.UIDs.Base)); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o710); err != nil {
		return nil, err
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return nil, err
	}
	ns, err := b.userns.get(rec.UIDs)
	if err != nil {
		return nil, err
	}
	root, err := idmap.ReadOnlyTree(b.cloneSource(b.runtime), ns)
	if err != nil {
		return nil, err
	}
	defer func() { go unix.Close(root) }() // dissolving a mount waits for RCU
	spec, err := ociSpec(rec.Spec, rec.UIDs, rootfs, "/"+b.cfg.CgroupParent+"/"+id, b.runtime, b.fsFor(rec, b.runtime), b.agentArgs())
	if err != nil {
		return nil, err
	}
	// Started in the background: runc and everything it starts at nice
	// backgroundNice, the container's cgroup at the least CPU weight. A
	// refill so takes mostly CPU time the node's other work leaves — on a
	// small node it would otherwise compete with the very creates it is
	// there to speed up, and with their first commands. A claim puts both
	// back (foreground, applyLimits).
	spec.Linux.Resources.CPU = &specs.LinuxCPU{Shares: ptrTo(uint64(blankShares))}
	if err := backend.WriteJSONFile(filepath.Join(dir, "config.json"), spec); err != nil {
		return nil, err
	}
	listener, err := listen(filepath.Join(dir, "agent.sock"))
	if err != nil {
		return nil, err
	}
	defer listener.Close()
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	if err := b.runc.run(ctx, b.startNS, root, id, dir, listener, logf, true); err != nil {
		return nil, err
	}
	b.runc.protectAgent(id)
	// Its first writable layer, of the size the last create asked for,
	// made now and in the background too: a claim of that size only
	// switches to it.
	b.pool.mu.Lock()
	size, cpu := cmp.Or(b.pool.diskMB, defaultDiskMB), b.pool.cpu
	b.pool.mu.Unlock()
	onThrowawayThread(func() {
		if err = setNice(0, backgroundNice); err == nil {
			err = b.prepareNextDisk(ctx, id, size)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("blank sandbox: writable layer: %w", err)
	}
	rec.nextDiskMB = size
	// And its commands' CPU cgroup, with the quota the last create asked
	// for: each write of a bandwidth file walks every CPU cgroup of the
	// host (writeBandwidth), and a claim with that quota then writes none.
	// Empty, it limits nothing until the claim.
	if cpu > 0 {
		st, err := b.runc.readState(id)
		if err != nil {
			return nil, err
		}
		tasks, err := commandsCgroups(st, api.Resources{CPU: cpu})
		if err != nil {
			return nil, fmt.Errorf("blank sandbox: %w", err)
		}
		closeAll(tasks)
	}
	return rec, nil
}

// ownsBlank says whether id is a blank sandbox of the live pool.
func (b *Backend) ownsBlank(id string) bool {
	if b.pool == nil {
		return false
	}
	_, ok := b.pool.owned.Load(id)
	return ok
}

// eligible says whether a create may be served from the pool. A sandbox
// with a network interface starts cold: its interface, resolv.conf and
// sysctls are set up by runc and connect around the start.
func (b *Backend) eligible(spec backend.Spec) bool {
	return b.pool != nil && !spec.NeedsNetwork
}

// createPooled serves a create from the pool. It returns false (and
// nothing changed) when the pool had nothing or the claim failed, for the
// caller to start the sandbox cold.
func (b *Backend) createPooled(ctx context.Context, spec backend.Spec) (bool, error) {
	b.pool.mu.Lock()
	b.pool.diskMB = diskMB(spec)
	b.pool.cpu = spec.Resources.CPU
	b.pool.mu.Unlock()
	blank := b.pool.take()
	if blank == nil {
		b.log.DebugContext(ctx, "pool: empty; starting cold", "sandbox", spec.ID)
		return false, nil
	}
	if _, err := os.Lstat(b.dir(spec.ID)); err == nil {
		b.pool.put(blank)
		return true, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	t0 := time.Now()
	defer b.pool.owned.Delete(blank.Spec.ID)
	if err := b.claim(ctx, blank, spec); err != nil {
		b.pool.count(false)
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			return true, err
		}
		b.log.WarnContext(ctx, "pool: claim failed; starting cold", "sandbox", spec.ID, "blank", blank.Spec.ID, "err", err)
		return false, nil
	}
	b.pool.count(true)
	// The line a cold create logs, with the blank it came from.
	b.log.DebugContext(ctx, "created", "sandbox", spec.ID, "from_blank", blank.Spec.ID, "took", time.Since(t0))
	return true, nil
}

// claim turns blank into sandbox spec: renames its directory and runc
// container, applies the spec's limits to its cgroups, takes the spec's
// layers and switches the agent onto them with the sandbox's host name and
// environment, then applies its file rules. What is left is exactly what a
// cold create starts (TestPoolMatchesCold). On error nothing of it is
// left.
func (b *Backend) claim(ctx context.Context, blank *record, spec backend.Spec) (err error) {
	old, id := blank.Spec.ID, spec.ID
	t0 := time.Now()
	if err := b.renameContainer(old, id); err != nil {
		b.teardown(context.WithoutCancel(ctx), old, blank)
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, b.dir(old), unix.AT_FDCWD, b.dir(id), unix.RENAME_NOREPLACE); err != nil {
		b.runc.delete(context.WithoutCancel(ctx), id)
		b.teardown(context.WithoutCancel(ctx), old, blank)
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("claim: %w", err)
	}
	baselines.Delete(b.dir(old))
	rec := &record{Spec: spec, UIDs: blank.UIDs, nextDiskMB: blank.nextDiskMB}
	b.mu.Lock()
	b.uids[rec.UIDs.Base] = id
	b.mu.Unlock()
	defer func() {
		if err != nil {
			b.teardown(context.WithoutCancel(ctx), id, rec)
		}
	}()
	st, err := b.runc.readState(id)
	if err != nil {
		return err
	}
	if err := applyLimits(st, spec.Resources); err != nil {
		return fmt.Errorf("claim: limits: %w", err)
	}
	// A blank made its commands' CPU cgroup for the last create's request
	// (startBlank); a sandbox without one has none, as a cold one.
	if dir, ok := st.CgroupPaths["cpu"]; ok && spec.Resources.CPU <= 0 {
		if err := unix.Rmdir(filepath.Join(dir, cmdCgroup)); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("claim: commands' cpu cgroup: %w", err)
		}
	}
	if err := foreground(st.InitPid); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	t1 := time.Now()
	if err := b.acquire(ctx, rec); err != nil {
		return err
	}
	t2 := time.Now()
	if err := b.resetInPlace(ctx, rec, &agent.ResetIdentity{Hostname: id, Env: sandboxEnv(spec)}); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	t3 := time.Now()
	if err := b.pushFiles(ctx, rec); err != nil {
		return err
	}
	b.log.DebugContext(ctx, "pool: claim steps", "sandbox", id, "rename_and_limits", t1.Sub(t0), "layers", t2.Sub(t1),
		"root_switch", t3.Sub(t2), "files", time.Since(t3))
	if err := backend.WriteJSONFile(filepath.Join(b.dir(id), "sandbox.json"), rec); err != nil {
		return err
	}
	b.mu.Lock()
	b.sandboxes[id] = rec
	b.mu.Unlock()
	return nil
}

// renameContainer renames runc's container old to id: its state
// directory, and in its state file its id, host name, bundle paths and
// cgroup paths. Its cgroup v1 directories are renamed to the sandbox's
// name (rename(2) within a hierarchy), so they are those a cold create
// makes; a cgroup v2 directory cannot be renamed (the kernel has no rename
// for cgroup2) and keeps the blank's name — moving the processes to a new
// cgroup instead would leave the agent's pages charged to the old one and
// drop the device filter runc attached to it. Every later step reads the
// paths from the state file.
func (b *Backend) renameContainer(old, id string) (err error) {
	from, to := filepath.Join(b.runc.root, old), filepath.Join(b.runc.root, id)
	raw, err := os.ReadFile(filepath.Join(from, "state.json"))
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	var state map[string]json.RawMessage
	if err := json.Unmarshal(raw, &state); err != nil {
		return fmt.Errorf("claim: runc state: %w", err)
	}
	quoted := func(s string) []byte { b, _ := json.Marshal(s); return b }
	state["id"] = quoted(id)
	var paths map[string]string
	if err := json.Unmarshal(state["cgroup_paths"], &paths); err != nil {
		return fmt.Errorf("claim: runc state: cgroup paths: %w", err)
	}
	renamed, err := renameCgroups(paths, old, id)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			undoCgroupRenames(renamed)
		}
	}()
	state["cgroup_paths"], _ = json.Marshal(paths)
	cfg := state["config"]
	cfg = bytes.ReplaceAll(cfg, []byte(b.dir(old)+"/"), []byte(b.dir(id)+"/"))
	cfg = bytes.ReplaceAll(cfg, append([]byte(`"hostname":`), quoted(old)...), append([]byte(`"hostname":`), quoted(id)...))
	cfg = bytes.ReplaceAll(cfg, []byte(`=`+b.dir(old)+`"`), []byte(`=`+b.dir(id)+`"`)) // the bundle label
	state["config"] = cfg
	out, err := json.Marshal(state)
	if err != nil {
		return fmt.Errorf("claim: runc state: %w", err)
	}
	if err := os.WriteFile(filepath.Join(from, "state.json.new"), out, 0o600); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	if err := os.Rename(filepath.Join(from, "state.json.new"), filepath.Join(from, "state.json")); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE); err != nil {
		// The state file names the new cgroups; put back the old one with
		// them undone (teardown of the blank reads it).
		os.WriteFile(filepath.Join(from, "state.json"), raw, 0o600)
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			return fmt.Errorf("container %s: %w", id, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("claim: %w", err)
	}
	return nil
}

// cgroupRename is one cgroup directory renamed by a claim.
type cgroupRename struct{ from, to string }

// renameCgroups renames, in paths (a runc state's cgroup_paths), every
// cgroup v1 directory named old to id, and rewrites paths to match. The
// cgroup v2 one ("" key, or any on a cgroup2 mount) keeps its name. On
// error it undoes its renames and leaves paths as they were.
func renameCgroups(paths map[string]string, old, id string) ([]cgroupRename, error) {
	var done []cgroupRename
	// Two controllers may share a directory (cpu and cpuacct, one a
	// symbolic link to the other): it is renamed once.
	moved := map[string]bool{}
	newPaths := map[string]string{}
	for ctl, dir := range paths {
		if filepath.Base(dir) != old || isCgroup2(dir) {
			continue
		}
		real, err := filepath.EvalSymlinks(dir)
		if err != nil {
			undoCgroupRenames(done)
			return nil, fmt.Errorf("claim: cgroup %s: %w", dir, err)
		}
		newPaths[ctl] = filepath.Join(filepath.Dir(dir), id)
		if moved[real] {
			continue
		}
		to := filepath.Join(filepath.Dir(real), id)
		// cgroupfs takes no rename flags; it refuses an existing name
		// itself (EEXIST).
		if err := unix.Rename(real, to); err != nil {
			undoCgroupRenames(done)
			// Not ErrAlreadyExists: a cgroup left with the sandbox's name
			// does not stop a cold create (runc joins it), which the
			// create falls back to.
			return nil, fmt.Errorf("claim: rename cgroup %s: %w", real, err)
		}
		done = append(done, cgroupRename{real, to})
		moved[real] = true
	}
	for ctl, p := range newPaths {
		paths[ctl] = p
	}
	return done, nil
}

func undoCgroupRenames(done []cgroupRename) {
	for _, r := range done {
		os.Rename(r.to, r.from)
	}
}

// isCgroup2 says whether dir is on a cgroup2 file system.
func isCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// applyLimits writes to a running container's cgroups the limits runc
// writes at start for r (see resources): memory (with swap equal to it),
// CPU shares and pids. The CPU quota comes after the root switch, as
// after a reset (limitCommands).
func applyLimits(st containerState, r api.Resources) error {
	write := func(dir, file string, v int64) error {
		return os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(v, 10)), 0)
	}
	v2, hasV2 := st.CgroupPaths[""]
	if r.MemoryMB > 0 {
		limit := r.MemoryMB << 20
		if dir, ok := st.CgroupPaths["memory"]; ok {
			if err := write(dir, "memory.limit_in_bytes", limit); err != nil {
				return err
			}
			if _, err := os.Stat(filepath.Join(dir, "memory.memsw.limit_in_bytes")); err == nil {
				if err := write(dir, "memory.memsw.limit_in_bytes", limit); err != nil {
					return err
				}
			}
		} else if hasV2 {
			if err := write(v2, "memory.max", limit); err != nil {
				return err
			}
			if err := write(v2, "memory.swap.max", 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	// A blank's cgroup has the lowest weight (blankShares); a cold create
	// without a CPU request has the kernel's default.
	shares, weight := int64(defaultShares), int64(defaultWeight)
	if r.CPU > 0 {
		shares = cpuShares(r.CPU)
		weight = 1 + ((shares-2)*9999)/262142 // runc's conversion
	}
	if dir, ok := st.CgroupPaths["cpu"]; ok {
		if err := write(dir, "cpu.shares", shares); err != nil {
			return err
		}
	} else if hasV2 {
		if err := write(v2, "cpu.weight", weight); err != nil {
			return err
		}
	}
	if r.Pids > 0 {
		if dir, ok := st.CgroupPaths["pids"]; ok {
			if err := write(dir, "pids.max", r.Pids); err != nil {
				return err
			}
		} else if hasV2 {
			if err := write(v2, "pids.max", r.Pids); err != nil {
				return err
			}
		}
	}
	return nil
}

// blankShares is a blank sandbox's cpu.shares (the kernel's least);
// defaultShares and defaultWeight are the kernel's defaults (cgroup v1 and
// v2), which a cold create without a CPU request keeps.
const (
	blankShares   = 2
	defaultShares = 1024
	defaultWeight = 100
)

func ptrTo[T any](v T) *T { return &v }

// backgroundNice is the nice value blank sandboxes start at (a weight of
// 110 against the 1024 of nice 0). Not SCHED_IDLE (a weight of 3): on a
// node whose CPUs are saturated a start would then take minutes, holding
// the kernel's locks it took meanwhile, and a Close waiting for it.
const backgroundNice = 10

// setNice gives thread tid (0: the caller) the normal policy at nice.
func setNice(tid, nice int) error {
	err := unix.SchedSetAttr(tid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL, Nice: int32(nice)}, 0)
	if err != nil {
		return fmt.Errorf("nice %d: %w", nice, err)
	}
	return nil
}

// foreground gives every thread of process pid (a claimed blank's agent,
// started at backgroundNice) the normal policy at nice 0 back, as a cold
// create's agent has; the commands it forks from then on inherit it.
// Threads the agent starts meanwhile inherit the thread starting them, so
// it looks again until a pass finds none left to change.
func foreground(pid int) error {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	for range 100 {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("scheduling policy: %w", err)
		}
		changed := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			attr, err := unix.SchedGetAttr(tid, 0)
			if err != nil {
				if errors.Is(err, unix.ESRCH) {
					continue // gone
				}
				return fmt.Errorf("scheduling policy of %d: %w", tid, err)
			}
			if attr.Policy == unix.SCHED_NORMAL && attr.Nice == 0 {
				continue
			}
			if err := setNice(tid, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("thread %d: %w", tid, err)
			}
			changed++
		}
		if changed == 0 {
			return nil
		}
	}
	return fmt.Errorf("scheduling policy of %d: threads keep appearing", pid)
}
