// Package container is the container backend: each sandbox is an OCI
// container run by runc, with dsec-agent as its init, on an overlay of the
// sandbox's EROFS layers (each mounted once per node) and a writable upper
// directory on node-local disk. The agent is reached through a unix socket
// the backend creates and hands to the container as an inherited file
// descriptor, so the socket has no path inside any sandbox.
//
// Containers are detached from the edge (own session, reparented to the
// host's init): killing the edge never kills a sandbox, and Recover finds
// them again. This package must never raise rlimits and never start a
// container without seccomp, a trimmed capability set and
// noNewPrivileges.
package container

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/disk"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/idmap"
	"github.com/dsec-project/dsec/internal/mount"
)

// Config configures the backend.
type Config struct {
	// Root is the backend's state directory on node-local disk.
	Root string
	// Runc is the runc binary; "runc" by default.
	Runc string
	// AgentPath is the dsec-agent binary to run as every sandbox's init.
	AgentPath string
	// CgroupParent is the cgroup under which sandboxes' cgroups are made;
	// "dsec" by default.
	CgroupParent string
	// MaxFileBytes bounds files read or written through the agent.
	MaxFileBytes int64
	// UIDBase is the first host uid (and gid) given to sandboxes: each
	// sandbox gets its own idmap.Size ids from there on; 1<<24 by default.
	UIDBase uint32
	// MaxSandboxes bounds how many sandboxes the node holds at once (the
	// number of id ranges); 16384 by default.
	MaxSandboxes int
	// Network, if set, gives sandboxes network modes allowlist and open.
	Network *NetworkConfig
	// Pool, if Max > 0, keeps blank sandboxes for creates to claim.
	Pool PoolConfig
	// SpareMemcgs bounds how many emptied memory cgroups of stopped
	// containers are kept for the next ones (spares); 64 by default,
	// negative: none.
	SpareMemcgs int
	Logger      *slog.Logger
}

// defaultDiskMB is the writable layer's size when the spec says nothing.
const defaultDiskMB = 10240

// Backend is the runc container backend.
type Backend struct {
	cfg  Config
	runc runc
	// runcCopy is the sealed copy of runc that runc.exe executes; nil:
	// none (sealedCopy).
	runcCopy *os.File
	// parentLock holds the host-wide lock of cfg.CgroupParent
	// (lockCgroupParent).
	parentLock *os.File
	layers     *mount.Layers
	startNS    *startNS // where runc starts containers
	cgroups    v1Hierarchies
	runtime    string // the lowest lower layer: the agent and mount points
	// runtimeTree is a detached clone of runtime, which the sandboxes'
	// roots clone their runtime layer from (see cloneSource); nil if the
	// kernel cannot clone a detached mount.
	runtimeTree *os.File
	disks       *disk.Templates
	nets        netState
	userns      usernsCache
	pool        *pool // nil: off
	trash       *trash
	log         *slog.Logger

	mu        sync.Mutex
	sandboxes map[string]*record
	uids      map[uint32]string // id range base → sandbox holding it
	// lowestFreeUIDs is the index of the lowest id range that may be
	// free: every range below it is in use.
	lowestFreeUIDs int
}

// record is what the backend keeps of a sandbox, in memory and in
// <dir>/sandbox.json. The file is written when the sandbox is complete: a
// directory without it is a create that did not finish.
type record struct {
	Spec backend.Spec `json:"spec"`
	// Lowers are the overlay's lower dirs, top first: the layers' mount
	// points from the toolkit down to the base, then the runtime layer.
	Lowers []string `json:"lowers"`
	// UIDs are the host ids the sandbox's user namespace maps to.
	UIDs idmap.Range `json:"uids"`
	// IP is the sandbox's address on the node's bridge, if it has one.
	IP netip.Addr `json:"ip,omitzero"`
	// CgroupID is the cgroup v2 id its egress rules are filed under.
	CgroupID uint64 `json:"cgroup_id,omitempty"`
	// Starts counts the containers started for it (create, resets,
	// repairs): it names their veth pairs.
	Starts int `json:"starts,omitempty"`
	// acquired says the layer references are held (in memory only).
	acquired bool
	// nextDiskMB is the size of a writable layer made ahead at disk.next
	// (a blank sandbox's; in memory only), 0 if none.
	nextDiskMB int64
}

var _ backend.Backend = (*Backend)(nil)

// New prepares the backend's directories and runtime layer.
func New(cfg Config) (_ *Backend, err error) {
	if cfg.Runc == "" {
		cfg.Runc = "runc"
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "dsec"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.UIDBase == 0 {
		cfg.UIDBase = 1 << 24
	}
	if cfg.SpareMemcgs == 0 {
		cfg.SpareMemcgs = 64
	}
	if cfg.MaxSandboxes <= 0 {
		cfg.MaxSandboxes = 16384
	}
	if uint64(cfg.UIDBase)+uint64(cfg.MaxSandboxes)*idmap.Size > 1<<32-1 {
		return nil, errdefs.Invalid("container backend: %d sandboxes of %d ids from uid %d overflow 32 bits", cfg.MaxSandboxes, idmap.Size, cfg.UIDBase)
	}
	lock, err := lockCgroupParent(cfg.CgroupParent, cfg.Root)
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		return nil, fmt.Errorf("container backend: %w", err)
	} else if err != nil {
		// No /run to lock in: as before the lock, nothing stops a second
		// backend from sharing the parent.
		cfg.Logger.Warn("container backend: the cgroup parent is not locked", "err", err)
	}
	defer func() {
		if err != nil {
			unlockCgroupParent(lock)
		}
	}()
	for _, d := range []string{"sandboxes", "layers", "runc", "runtime"} {
		if err := os.MkdirAll(filepath.Join(cfg.Root, d), 0o700); err != nil {
			return nil, fmt.Errorf("container backend: %w", err)
		}
	}
	if err := traversable(filepath.Join(cfg.Root, "sandboxes")); err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	layers, err := mount.NewLayers(filepath.Join(cfg.Root, "layers"))
	if err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	disks, err := disk.NewTemplates(filepath.Join(cfg.Root, "disk-templates"))
	if err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	b := &Backend{
		cfg:        cfg,
		parentLock: lock,
		runc:       runc{bin: cfg.Runc, root: filepath.Join(cfg.Root, "runc"), log: cfg.Logger, spares: newSpares(cfg.CgroupParent, cfg.SpareMemcgs)},
		layers:     layers,
		disks:      disks,
		log:        cfg.Logger.With("backend", api.BackendContainer),
		sandboxes:  map[string]*record{},
		uids:       map[uint32]string{},
	}
	if b.trash, err = newTrash(filepath.Join(cfg.Root, "trash"), b.log); err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	if b.cgroups, err = hostV1Hierarchies(); err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	rt, err := b.makeRuntime()
	if err != nil {
		return nil, err
	}
	b.runtime = rt
	b.runtimeTree = detachedTree(rt, b.log)
	runcPath, err := exec.LookPath(cfg.Runc)
	if err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	if f, exe, err := sealedCopy(runcPath); err != nil {
		b.log.Warn("runc copies itself at every start", "err", err)
	} else {
		b.runcCopy, b.runc.exe = f, exe
	}
	// The sysfs sandboxes without an interface share (see sandboxFS).
	sysfs := filepath.Join(cfg.Root, "sysfs")
	if err := os.MkdirAll(sysfs, 0o755); err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	if err := pinNetns(b.sysfsNetns()); err != nil {
		b.log.Warn("every sandbox mounts a sysfs of its own", "err", err)
		sysfs = ""
	}
	if b.startNS, err = newStartNS([]string{cfg.Root, runcPath, cfg.AgentPath}, sysfs, b.sysfsNetns()); b.startNS == nil {
		return nil, fmt.Errorf("container backend: %w", err)
	} else if err != nil {
		b.log.Warn("every sandbox mounts a sysfs of its own", "err", err)
	}
	if cfg.Network != nil {
		if err := b.setupNetwork(context.Background(), cfg.Network); err != nil {
			b.startNS.Close()
			return nil, fmt.Errorf("container backend: %w", err)
		}
	}
	if cfg.Pool.Max > 0 {
		b.pool = newPool(cfg.Pool)
		go b.refill()
	}
	return b, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return api.BackendContainer }

// makeRuntime lays out the runtime layer: a directory that sits under the
// base layer and provides the agent binary, its seccomp programs and the
// mount points runc needs, so that nothing is ever written into a
// sandbox's upper dir by dsec itself. It is named by the hash of the agent
// and the programs, so sandboxes started with an older agent keep theirs.
// Inside a sandbox /.dsec is a read-only bind of its .dsec directory, so
// that no sandbox can replace the agent or its filters with copies in its
// upper dir.
func (b *Backend) makeRuntime() (string, error) {
	f, err := os.Open(b.cfg.AgentPath)
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	defer f.Close()
	agentBPF, commandBPF, err := filters()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash agent binary: %w", err)
	}
	h.Write(agentBPF)
	h.Write(commandBPF)
	h.Write([]byte("layout 3")) // 2: .dsec/empty; 3: .dsec/cgroup
	h.Write([]byte(b.cgroups.String()))
	// The sandbox's root (an unprivileged host uid) must reach its .dsec
	// for runc to bind it.
	if err := os.Chmod(filepath.Join(b.cfg.Root, "runtime"), 0o711); err != nil {
		return "", err
	}
	dir := filepath.Join(b.cfg.Root, "runtime", hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(filepath.Join(b.cfg.Root, "runtime"), ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, d := range []string{".dsec/seccomp", ".dsec/empty", "proc", "sys", "dev", "etc", "root", "tmp", "run"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o755); err != nil {
			return "", err
		}
	}
	// What the agent binds over masked directories (agent.MaskedDirs).
	if err := os.Chmod(filepath.Join(tmp, ".dsec/empty"), 0o555); err != nil {
		return "", err
	}
	if err := os.Chmod(filepath.Join(tmp, "tmp"), 0o1777|os.ModeSticky); err != nil {
		return "", err
	}
	if len(b.cgroups.dirs) > 0 {
		if err := b.cgroups.makeSkeleton(tmp); err != nil {
			return "", err
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	dst, err := os.OpenFile(filepath.Join(tmp, agentPath), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(dst, f); err != nil {
		dst.Close()
		return "", err
	}
	if err := dst.Close(); err != nil {
		return "", err
	}
	for name, prog := range map[string][]byte{"agent.bpf": agentBPF, "command.bpf": commandBPF} {
		if err := os.WriteFile(filepath.Join(tmp, ".dsec/seccomp", name), prog, 0o644); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("install runtime layer: %w", err)
	}
	return dir, nil
}

// agentArgs is the agent's command line inside the container.
func (b *Backend) agentArgs() []string {
	args := []string{agentPath, "--listen-fd", "3", "--seccomp", "/.dsec/seccomp"}
	if b.cfg.MaxFileBytes > 0 {
		args = append(args, "--max-file-bytes", strconv.FormatInt(b.cfg.MaxFileBytes, 10))
	}
	return args
}

func (b *Backend) dir(id string) string { return filepath.Join(b.cfg.Root, "sandboxes", id) }

// Create implements backend.Backend.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (err error) {
	if spec.ID == "" || filepath.Base(spec.ID) != spec.ID || len(spec.Layers) == 0 {
		return errdefs.Invalid("sandbox spec needs an id and at least one layer")
	}
	if b.eligible(spec) {
		if done, err := b.createPooled(ctx, spec); done {
			return err
		}
	}
	dir := b.dir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	rec := &record{Spec: spec}
	defer func() {
		if err != nil {
			b.teardown(context.WithoutCancel(ctx), spec.ID, rec)
		}
	}()
	if rec.UIDs, err = b.allocUIDs(spec.ID); err != nil {
		return err
	}
	// runc mounts the root file system as the sandbox's root, which must
	// reach it; no other sandbox may.
	if err := os.Chown(dir, 0, int(rec.UIDs.Base)); err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	if err := os.Chmod(dir, 0o710); err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	if err := b.reserveNetwork(rec); err != nil {
		return err
	}
	t0 := time.Now()
	if err := b.acquire(ctx, rec); err != nil {
		return err
	}
	t1 := time.Now()
	if err := b.start(ctx, rec); err != nil {
		return err
	}
	if err := backend.WriteJSONFile(filepath.Join(dir, "sandbox.json"), rec); err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	b.log.DebugContext(ctx, "created", "sandbox", spec.ID, "layers", t1.Sub(t0), "start", time.Since(t1))
	b.mu.Lock()
	b.sandboxes[spec.ID] = rec
	b.mu.Unlock()
	return nil
}

// acquire takes a reference on each of the sandbox's layers and sets its
// lower dirs.
func (b *Backend) acquire(ctx context.Context, rec *record) error {
	lowers := []string{b.runtime}
	for i, l := range rec.Spec.Layers {
		if l.Dir {
			lowers = append([]string{l.Path}, lowers...)
			continue
		}
		mp, err := b.layers.Acquire(ctx, l.Digest, mount.Source{Image: l.Path, Device: l.Device, DirectIO: l.OnDemand})
		if err != nil {
			for _, prev := range rec.Spec.Layers[:i] {
				if !prev.Dir {
					b.layers.Release(prev.Digest)
				}
			}
			return fmt.Errorf("sandbox %s: mount layer %s: %w", rec.Spec.ID, l.Digest, err)
		}
		lowers = append([]string{mp}, lowers...)
	}
	if rec.Lowers == nil {
		rec.Lowers = lowers
	}
	rec.acquired = true
	return nil
}

func (b *Backend) release(rec *record) {
	if !rec.acquired {
		return
	}
	for _, l := range rec.Spec.Layers {
		if l.Dir {
			continue
		}
		if err := b.layers.Release(l.Digest); err != nil {
			b.log.Warn("release layer", "sandbox", rec.Spec.ID, "layer", l.Digest, "err", err)
		}
	}
	rec.acquired = false
}

// start mounts the sandbox's overlay and starts its container. The layers
// must be acquired. On error it undoes what it did.
func (b *Backend) start(ctx context.Context, rec *record) (err error) {
	id := rec.Spec.ID
	dir := b.dir(id)
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	if _, err := os.Stat(filepath.Join(rec.Lowers[len(rec.Lowers)-1], ".dsec/seccomp")); err != nil {
		// A runtime layer from before the agent loaded seccomp itself:
		// its agent would run without a filter.
		rec.Lowers[len(rec.Lowers)-1] = b.runtime
	}
	tDisk := time.Now()
	if err := b.mountDisk(ctx, rec); err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	tRoot := time.Now()
	// The overlay is attached only where runc starts the container (see
	// startNS): the edge's namespace never holds it.
	root, releaseRoot, err := b.detachedRootfs(rec, filepath.Join(dir, "disk"))
	if err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	defer releaseRoot()
	b.log.DebugContext(ctx, "mounted", "sandbox", id, "disk", tRoot.Sub(tDisk), "rootfs", time.Since(tRoot))
	runtime := rec.Lowers[len(rec.Lowers)-1]
	spec, err := ociSpec(rec.Spec, rec.UIDs, rootfs, "/"+b.cfg.CgroupParent+"/"+id, runtime, b.fsFor(rec, runtime), b.agentArgs())
	if err != nil {
		return err
	}
	if rec.Spec.NeedsNetwork {
		resolv, err := b.writeResolvConf(rec)
		if err != nil {
			return fmt.Errorf("start sandbox %s: %w", id, err)
		}
		withNetwork(spec, resolv)
	}
	if err := backend.WriteJSONFile(filepath.Join(dir, "config.json"), spec); err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	listener, err := listen(filepath.Join(dir, "agent.sock"))
	if err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	defer listener.Close()
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	defer logf.Close()
	t0 := time.Now()
	defer func() { b.log.DebugContext(ctx, "started container", "sandbox", id, "runc_run", time.Since(t0)) }()
	if err := b.runc.run(ctx, b.startNS, root, id, dir, listener, logf, false); err != nil {
		b.runc.delete(context.WithoutCancel(ctx), id)
		return err
	}
	if err := b.limitCommands(ctx, rec); err != nil {
		b.runc.delete(context.WithoutCancel(ctx), id)
		return fmt.Errorf("start sandbox %s: commands' limits: %w", id, err)
	}
	b.runc.protectAgent(id)
	// Nothing but the edge reaches the agent before Create returns, so the
	// first command already runs under the network and file rules.
	if err := b.connect(ctx, rec); err != nil {
		b.runc.delete(context.WithoutCancel(ctx), id)
		return fmt.Errorf("start sandbox %s: network: %w", id, err)
	}
	if err := b.pushFiles(ctx, rec); err != nil {
		b.runc.delete(context.WithoutCancel(ctx), id)
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	b.recordBaseline(id)
	return nil
}

// listen creates the agent's listening socket and returns it as a file to
// hand to the container. The socket file stays after we close our copy.
func listen(path string) (*os.File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	short, done, err := backend.ShortPath(path)
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	defer done()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: short, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	// The sandbox dir is reachable by the sandbox's own uid; its agent's
	// socket is for root alone.
	if err := os.Chmod(short, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	f, err := l.File()
	l.Close()
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	return f, nil
}

// teardown removes everything of a sandbox, tolerating what is already
// gone. It is the single cleanup path for failed creates and destroys.
func (b *Backend) teardown(ctx context.Context, id string, rec *record) error {
	dir := b.dir(id)
	b.forgetBaseline(id)
	var errs []error
	t0 := time.Now()
	if err := b.runc.delete(ctx, id); err != nil {
		errs = append(errs, err)
	}
	t1 := time.Now()
	if err := mount.Unmount(filepath.Join(dir, "rootfs")); err != nil {
		errs = append(errs, err)
	}
	if err := mount.Unmount(filepath.Join(dir, "disk")); err != nil {
		errs = append(errs, err)
	}
	t2 := time.Now()
	b.dropNextDisk(id)
	if rec != nil {
		b.disconnect(rec)
		b.release(rec)
		b.freeUIDs(id, rec.UIDs)
	}
	if len(errs) == 0 {
		if err := b.trash.put(dir); err != nil {
			errs = append(errs, err)
		}
	}
	err := backend.FinishTeardown(id, dir, errs)
	b.log.DebugContext(ctx, "teardown steps", "sandbox", id, "container", t1.Sub(t0), "unmount", t2.Sub(t1), "files", time.Since(t2))
	return err
}

// Destroy implements backend.Backend.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	// A failed teardown keeps the record, so a retry releases the layers.
	return backend.Destroy(&b.mu, b.sandboxes, id, func(rec *record) error { return b.teardown(ctx, id, rec) })
}

func (b *Backend) get(id string) (*record, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rec, ok := b.sandboxes[id]
	if !ok {
		return nil, errdefs.NotFound("sandbox %s", id)
	}
	return rec, nil
}

// Pause implements backend.Backend.
func (b *Backend) Pause(ctx context.Context, id string) error {
	if _, err := b.get(id); err != nil {
		return err
	}
	return b.runc.pause(ctx, id)
}

// Resume implements backend.Backend.
func (b *Backend) Resume(ctx context.Context, id string) error {
	if _, err := b.get(id); err != nil {
		return err
	}
	return b.runc.resume(ctx, id)
}

// Dial implements backend.Backend.
func (b *Backend) Dial(ctx context.Context, id string) (net.Conn, error) {
	short, done, err := backend.ShortPath(filepath.Join(b.dir(id), "agent.sock"))
	if err != nil {
		return nil, fmt.Errorf("dial agent of %s: %w", id, err)
	}
	defer done()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", short)
	if err != nil {
		return nil, fmt.Errorf("dial agent of %s: %w: %w", id, err, errdefs.ErrUnavailable)
	}
	return c, nil
}

// State implements backend.Backend.
func (b *Backend) State(ctx context.Context, id string) (string, error) {
	if _, err := b.get(id); err != nil {
		return "", err
	}
	st, err := b.runc.state(ctx, id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return api.StateFailed, nil
		}
		return "", err
	}
	switch st.Status {
	case "running":
		return api.StateRunning, nil
	case "paused":
		return api.StatePaused, nil
	}
	return api.StateFailed, nil
}

// Close implements io.Closer: it removes the cgroup parent where it holds
// no sandbox any more (the kernel refuses to remove one that still holds a
// sandbox's cgroup, so sandboxes that outlive the edge keep theirs, and
// the next start makes it again).
func (b *Backend) Close() error {
	b.drainPool()
	b.trash.wait()
	b.runc.spares.removeAll()
	dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", b.cfg.CgroupParent))
	for _, d := range append(dirs, filepath.Join(cgroupRoot, b.cfg.CgroupParent)) {
		unix.Rmdir(d) // EBUSY: sandboxes live on; ENOENT/ENOTDIR: none here
	}
	if b.runcCopy != nil {
		b.runcCopy.Close()
	}
	if b.runtimeTree != nil {
		b.runtimeTree.Close()
	}
	defer func() {
		// Last: the next backend may sweep the parent.
		unlockCgroupParent(b.parentLock)
		b.parentLock = nil
	}()
	b.mu.Lock()
	left := len(b.sandboxes)
	b.mu.Unlock()
	if left == 0 {
		// No sandbox binds the shared sysfs any more (see pinNetns).
		if err := unpinNetns(b.sysfsNetns()); err != nil {
			b.log.Warn("close", "err", err)
		}
	}
	return b.startNS.Close()
}

// sysfsNetns is where the shared sysfs's network namespace is pinned.
func (b *Backend) sysfsNetns() string { return filepath.Join(b.cfg.Root, sysfsPin) }
