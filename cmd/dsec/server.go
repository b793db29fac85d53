package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/blobfs"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/fncall"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/reqid"
	"github.com/dsec-project/dsec/internal/scheduler"
	"github.com/dsec-project/dsec/internal/server"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/postgres"
	"github.com/dsec-project/dsec/internal/store/sqlite"
)

// nodeFlags are what `dsec server` and `dsec edge` share: how this node
// runs sandboxes.
type nodeFlags struct {
	nodeID       string
	agent        string
	runc         string
	cgroupParent string
	maxFileBytes int64
	uidBase      uint
	pool         container.PoolConfig
	spareMemcgs  int
	net          netFlags
	cpu          float64
	memoryMB     int64
	diskMB       int64
	labels       stringList
	heartbeat    time.Duration
	debug        bool
	layers       layerFlags
	microvm      microvmFlags
	fullvm       fullvmFlags

	// stopBlobfsSupervisor ends the restarts of the node's blobfs keeper
	// (set by nodeLayers), before the node stops blobfs.
	stopBlobfsSupervisor func()
}

func (n *nodeFlags) register(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	fs.StringVar(&n.nodeID, "node-id", host, "this node's name")
	fs.StringVar(&n.agent, "agent", "", "dsec-agent binary (default: next to dsec, then $PATH)")
	fs.StringVar(&n.runc, "runc", "runc", "runc binary")
	fs.StringVar(&n.cgroupParent, "cgroup-parent", "dsec", "cgroup under which sandboxes' cgroups are made")
	fs.Int64Var(&n.maxFileBytes, "max-file-bytes", 100<<20, "largest file a sandbox's files API reads or writes")
	fs.UintVar(&n.uidBase, "uid-base", 1<<24, "first host uid of the sandboxes' id ranges (65536 ids each)")
	fs.IntVar(&n.pool.Max, "container-pool", 32, "most blank container sandboxes (~2.7 MB each) kept started for creates to claim, at about a reset's cost (0: off)")
	fs.IntVar(&n.pool.Min, "container-pool-min", 2, "blank container sandboxes kept even without demand")
	fs.DurationVar(&n.pool.Window, "container-pool-window", time.Minute, "the pool refills toward the creates of this last window")
	fs.IntVar(&n.spareMemcgs, "spare-memcgs", 64, "emptied memory cgroups of destroyed container sandboxes kept for the next ones: the kernel's cost of making and removing one grows with the node (0: none)")
	n.net.register(fs)
	fs.Float64Var(&n.cpu, "cpu", 0, "cores this node offers (default: all)")
	fs.Int64Var(&n.memoryMB, "memory-mb", 0, "memory this node offers, MB (default: 90% of RAM, leaving at least 512 MB)")
	fs.Int64Var(&n.diskMB, "disk-mb", 0, "writable-layer disk this node offers, MB (default: its data directory's filesystem less 5%, at least 1 GiB, kept free)")
	fs.Var(&n.labels, "label", "node label KEY=VALUE (repeatable); pool=burst makes it a cloud burst node")
	fs.DurationVar(&n.heartbeat, "heartbeat", 2*time.Second, "time between the node's heartbeats")
	fs.BoolVar(&n.debug, "debug", false, "debug logging")
	n.layers.register(fs)
	n.microvm.register(fs)
	n.fullvm.register(fs)
}

func (n *nodeFlags) logger() *slog.Logger {
	lvl := slog.LevelInfo
	if n.debug {
		lvl = slog.LevelDebug
	}
	// Lines logged with a request's context carry its id (package reqid).
	return reqid.Logger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})))
}

// agentBinary finds dsec-agent: the flag, next to this binary, on $PATH.
func (n *nodeFlags) agentBinary() (string, error) {
	if n.agent != "" {
		return filepath.Abs(n.agent)
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "dsec-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("dsec-agent"); err == nil {
		return p, nil
	}
	return "", errors.New("cannot find the dsec-agent binary: build it (make build) or pass --agent")
}

// nodeLayers starts (or finds) the node's blobfs and returns the layers of
// the store at storeLoc ("" for the local store of the all-in-one server,
// localStore) for this node.
func (n *nodeFlags) nodeLayers(ctx context.Context, dataDir, storeLoc, localStore string, st *layer.Store, log *slog.Logger) (edge.Layers, error) {
	if err := n.layers.validate(); err != nil {
		return nil, err
	}
	// Before anything reads the node's state: refuse one a newer dsec
	// wrote (a downgrade), stamp an older one.
	if err := edge.CheckStateVersion(dataDir); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	layerDir := filepath.Join(dataDir, "layerdata")
	bfsDir := filepath.Join(dataDir, "blobfs")
	argv := []string{self, "blobfs", "--dir", bfsDir, "--manifests", filepath.Join(layerDir, "manifests"),
		"--cache", filepath.Join(dataDir, "chunks"), "--cache-max", strconv.FormatInt(n.layers.cacheMax, 10),
		"--node-id", n.nodeID}
	loc := storeLoc
	if loc == "" {
		loc = localStore
	}
	env := []string{storeEnv + "=" + loc}
	if err := blobfs.EnsureDaemon(ctx, bfsDir, argv, env, log); err != nil {
		return nil, err
	}
	// A keeper that dies is started again and adopts its worker's FUSE
	// connection: the layers mounted over blobfs live on.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	supervised := make(chan struct{})
	go func() {
		defer close(supervised)
		blobfs.Supervise(sctx, bfsDir, argv, env, log)
	}()
	n.stopBlobfsSupervisor = func() { cancel(); <-supervised }
	cfg := edge.StoreLayersConfig{
		Store: st, Dir: layerDir, Blobfs: blobfs.MountDir(bfsDir),
		Mode: n.layers.mode, DirectBelow: n.layers.directBelow, Logger: log,
	}
	l, err := edge.NewStoreLayers(cfg)
	if err != nil {
		n.stopBlobfs(ctx, dataDir, log)
		return nil, err
	}
	return l, nil
}

// startEdge builds this node's backends and edge over the layer store.
// The function it returns stops them and the node's blobfs (started by
// nodeLayers); on an error it does so itself, so that a node that fails
// to start (a missing runc, a cgroup parent another dsec holds) leaves
// no FUSE mount or process behind.
func (n *nodeFlags) startEdge(ctx context.Context, dataDir string, layers edge.Layers, log *slog.Logger) (_ *edge.Edge, _ func(), err error) {
	closers := []func(){func() { n.stopBlobfs(ctx, dataDir, log) }}
	stop := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	agent, err := n.agentBinary()
	if err != nil {
		return nil, nil, err
	}
	netCfg, err := n.net.config()
	if err != nil {
		return nil, nil, err
	}
	cb, err := container.New(container.Config{
		Root: filepath.Join(dataDir, "container"), Runc: n.runc, AgentPath: agent, Logger: log,
		CgroupParent: n.cgroupParent, MaxFileBytes: n.maxFileBytes, UIDBase: uint32(n.uidBase),
		Network: netCfg, Pool: n.pool, SpareMemcgs: cmp.Or(n.spareMemcgs, -1),
	})
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, func() { cb.Close() })
	backends := []backend.Backend{cb}
	mb, err := n.microvm.backend(ctx, filepath.Join(dataDir, "microvm"), agent, n.cgroupParent, n.maxFileBytes, log)
	if err != nil {
		return nil, nil, err
	}
	if mb != nil {
		backends = append(backends, mb)
		closers = append(closers, func() { mb.Close() })
	}
	fb, err := n.fullvm.backend(ctx, &n.microvm, filepath.Join(dataDir, "fullvm"), n.cgroupParent, n.maxFileBytes, log)
	if err != nil {
		return nil, nil, err
	}
	if fb != nil {
		backends = append(backends, fb)
		closers = append(closers, func() { fb.Close() })
	}
	ecfg := edge.Config{NodeID: n.nodeID, Backends: backends, Layers: layers, Logger: log,
		Capacity: api.Resources{CPU: n.cpu, MemoryMB: n.memoryMB, DiskMB: n.diskMB}, DiskDir: dataDir}
	if p, ok := layers.(*edge.StoreLayers); ok {
		ecfg.Packer = p
	}
	e, err := edge.New(ctx, ecfg)
	if err != nil {
		return nil, nil, err
	}
	return e, stop, nil
}

// stopBlobfs stops the node's blobfs unless layers over it are still in
// use: a node that stops with no sandbox left leaves no FUSE mount or
// process behind; one whose sandboxes live on keeps their blobfs.
func (n *nodeFlags) stopBlobfs(ctx context.Context, dataDir string, log *slog.Logger) {
	if n.stopBlobfsSupervisor != nil {
		n.stopBlobfsSupervisor()
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if stopped, err := blobfs.StopDaemon(sctx, filepath.Join(dataDir, "blobfs")); err != nil {
		log.WarnContext(ctx, "blobfs left running", "err", err)
	} else if stopped {
		log.InfoContext(ctx, "blobfs stopped: no layer in use")
	} else {
		log.InfoContext(ctx, "blobfs left serving the sandboxes that outlive this process")
	}
}

func serverCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dsec server", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7070", "API address")
	data := fs.String("data", defaultDataDir(), "data directory")
	urlKeyFile := fs.String("url-signing-key", "", "file of the secret signed port URLs are made with (default <data>/url-signing.key, created if missing); replicas must share one")
	busybox := fs.String("busybox", "/bin/busybox", "static busybox for the default base layer base:minimal (\"\" to skip)")
	fc := fncall.DefaultConfig
	fs.IntVar(&fc.Min, "fncall-min", fc.Min, "warm sandboxes each FnCall pool keeps at least")
	fs.IntVar(&fc.Max, "fncall-max", fc.Max, "sandboxes each FnCall pool holds at most")
	fs.IntVar(&fc.TenantConcurrency, "fncall-tenant-concurrency", fc.TenantConcurrency, "FnCall calls one tenant may have in flight")
	fs.DurationVar(&fc.IdleTimeout, "fncall-idle", fc.IdleTimeout, "how long a FnCall sandbox beyond demand stays idle before it is destroyed")
	fs.DurationVar(&fc.Window, "fncall-window", fc.Window, "how long past demand sizes a FnCall pool")
	batchParallel := fs.Int("batch-parallel", 8, "sandboxes of a batch built at once on each node")
	idle := fs.Duration("idle-timeout", 0, "destroy sandboxes idle this long unless their create sets idle_timeout_seconds (0: never)")
	retention := fs.Duration("trajectory-retention", 7*24*time.Hour, "keep a trajectory this long after its newest step")
	profilesFile := fs.String("profiles", "", "JSON file of named policy profiles: {\"name\": {\"phase\": …, \"phases\": {…}}}")
	storeLoc := fs.String("store", "", "layer store: a directory shared by the nodes, s3://ACCESS:SECRET@HOST:PORT/BUCKET[/PREFIX], or empty for <data>/store")
	ckptKept := fs.Int("trajectory-checkpoints", server.DefaultCheckpointsKept, "checkpoints a trajectory keeps (older ones are collected)")
	buildCacheTTL := fs.Duration("build-cache-ttl", server.DefaultBuildCacheTTL, "keep a Dockerfile step's cache layer that no layer stacks on this long after a build last used it")
	forkGrace := fs.Duration("fork-layer-grace", server.DefaultForkLayerGrace, "keep a fork's layer at least this long after the fork, before collecting it once unused")
	snapDepth := fs.Int("snapshot-max-depth", server.DefaultMaxSnapshotDepth, "snapshot layers that may stack before a snapshot flattens them")
	db := fs.String("db", os.Getenv("DSEC_DB"), "control-plane database: empty for SQLite in the data dir, or a PostgreSQL URL "+
		"(postgres://…) shared by every replica ($DSEC_DB)")
	localEdge := fs.Bool("local-edge", true, "run a node in this process (the all-in-one); false for a control plane only")
	edgeInProcess := fs.Bool("edge-in-process", true, "with --local-edge: agent calls (exec, files, processes) reach the node's edge in-process; false: over its socket, as for a remote node")
	clusterToken := fs.String("cluster-token", os.Getenv("DSEC_CLUSTER_TOKEN"), "token nodes join with (dsec edge --join … --token); empty: no remote nodes ($DSEC_CLUSTER_TOKEN)")
	overcommit := fs.Float64("cpu-overcommit", scheduler.DefaultConfig.CPUOvercommit, "how many times a node's cores may be promised to sandboxes")
	burst := fs.Float64("burst-threshold", scheduler.DefaultConfig.BurstThreshold, "utilisation of the regular nodes above which burst-eligible sandboxes go to burst nodes")
	diskOvercommit := fs.Float64("disk-overcommit", scheduler.DefaultConfig.DiskOvercommit, "how many times a node's writable-layer disk may be promised to sandboxes' disk_mb (1: never; a node whose disk is down to its reserve takes nothing new whatever the factor)")
	nodeTimeout := fs.Duration("node-timeout", 10*time.Second, "a node unheard for this long is down and its sandboxes lost")
	var compat compatFlags
	compat.register(fs)
	var nf nodeFlags
	nf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *localEdge && os.Geteuid() != 0 {
		return errors.New("dsec server runs sandboxes and must run as root (or pass --local-edge=false)")
	}
	log := nf.logger()
	dataDir, err := filepath.Abs(*data)
	if err != nil {
		return err
	}
	if *urlKeyFile == "" {
		*urlKeyFile = filepath.Join(dataDir, "url-signing.key")
	}
	for _, d := range []string{dataDir, filepath.Join(dataDir, "tmp"), filepath.Join(dataDir, "edge")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	st, err := openStore(ctx, *db, dataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := server.Bootstrap(ctx, st, filepath.Join(dataDir, "admin.key")); err != nil {
		return err
	}
	localStore := filepath.Join(dataDir, "store")
	bs, err := openBlobStore(ctx, *storeLoc, localStore, nf.nodeID)
	if err != nil {
		return err
	}
	layers, err := layer.NewStore(bs, filepath.Join(dataDir, "tmp"))
	if err != nil {
		return err
	}
	if *ckptKept < 1 {
		return errors.New("--trajectory-checkpoints must be at least 1")
	}
	if *idle < 0 || *retention <= 0 {
		return errors.New("--idle-timeout must not be negative and --trajectory-retention must be positive")
	}
	profiles, err := loadProfiles(*profilesFile)
	if err != nil {
		return err
	}
	sched := scheduler.DefaultConfig
	sched.CPUOvercommit, sched.BurstThreshold, sched.DiskOvercommit = *overcommit, *burst, *diskOvercommit
	if *diskOvercommit < 1 {
		return errors.New("--disk-overcommit must be at least 1")
	}
	urlKey, err := server.LoadURLSigningKey(*urlKeyFile)
	if err != nil {
		return err
	}
	var local atomic.Pointer[inProcessEdge]
	newNodeClient := func(addr, token string) (*edge.Client, error) {
		c, err := edge.NewClient(addr, token)
		if l := local.Load(); err == nil && l != nil && l.addr == addr {
			c.WithLocal(l.handler)
		}
		return c, err
	}
	if !*edgeInProcess {
		newNodeClient = edge.NewClient
	}
	srv := server.New(server.Config{
		URLSigningKey: urlKey, NewNodeClient: newNodeClient,
		Store: st, Layers: layers, TmpDir: filepath.Join(dataDir, "tmp"), Logger: log, Profiles: profiles,
		DefaultIdleTimeout: idle.Truncate(time.Second), TrajectoryRetention: *retention,
		FnCall: fc, BatchParallel: *batchParallel, MaxSnapshotDepth: *snapDepth,
		Scheduler: scheduler.New(sched), ClusterToken: *clusterToken, NodeTimeout: *nodeTimeout,
		CheckpointsKept: *ckptKept, KeepLayerObjects: *db != "", BuildCacheTTL: *buildCacheTTL, ForkLayerGrace: *forkGrace, Compat: compat.config(),
	})
	if *localEdge {
		nodeLayers, err := nf.nodeLayers(ctx, filepath.Join(dataDir, "edge"), *storeLoc, localStore, layers, log)
		if err != nil {
			return err
		}
		stop, err := nf.runLocalEdge(ctx, dataDir, nodeLayers, srv, &local, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if *busybox != "" {
		if err := srv.EnsureDefaultBase(ctx, *busybox); err != nil {
			return fmt.Errorf("default base layer: %w", err)
		}
	}
	go srv.Run(ctx)
	err = serveHTTP(ctx, *listen, srv.Handler(), log, "dsec server ready", "data", dataDir,
		"admin_key", filepath.Join(dataDir, "admin.key"))
	// Before the local edge stops (deferred above): the FnCall pools'
	// sandboxes go with the server that made them.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if derr := srv.DrainFnCall(dctx); derr != nil {
		log.Warn("stop: FnCall pool sandboxes left for the next start", "err", derr)
	}
	return err
}

// openStore opens the control plane's database: SQLite in the data dir,
// or PostgreSQL.
func openStore(ctx context.Context, db, dataDir string) (store.Store, error) {
	if strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://") || strings.Contains(db, "host=") {
		return postgres.Open(ctx, db)
	}
	if db != "" {
		return nil, fmt.Errorf("--db %q: want a postgres:// URL, or nothing for SQLite", db)
	}
	return sqlite.Open(ctx, filepath.Join(dataDir, "dsec.db"))
}

// inProcessEdge is the all-in-one's own edge: the address it joins with and
// its API handler, which the control plane's client of that address
// calls in-process for agent requests (edge.Client.WithLocal).
type inProcessEdge struct {
	addr    string
	handler http.Handler
}

// runLocalEdge starts the all-in-one's own node: its edge API on a unix
// socket only root can reach, reporting to the control plane in-process
// exactly as a remote node does over HTTP. It sets local before the node
// joins.
func (n *nodeFlags) runLocalEdge(ctx context.Context, dataDir string, layers edge.Layers, srv *server.Server, local *atomic.Pointer[inProcessEdge], log *slog.Logger) (func(), error) {
	e, closeEdge, err := n.startEdge(ctx, filepath.Join(dataDir, "edge"), layers, log)
	if err != nil {
		return nil, err
	}
	edgeSock := filepath.Join(dataDir, "edge.sock")
	os.Remove(edgeSock)
	el, err := net.Listen("unix", edgeSock)
	if err != nil {
		closeEdge()
		return nil, err
	}
	h := e.Handler("")
	edgeSrv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go edgeSrv.Serve(el)
	local.Store(&inProcessEdge{addr: "unix://" + edgeSock, handler: h})
	labels, err := keyValues(n.labels, "--label")
	if err != nil {
		edgeSrv.Close()
		closeEdge()
		return nil, err
	}
	jc := edge.JoinConfig{Addr: "unix://" + edgeSock, Labels: labels, Interval: n.heartbeat}
	// Register and reconcile before serving, so that the first create finds
	// the node and every record says what the node runs.
	if err := srv.JoinLocal(ctx, e.Heartbeat(ctx, jc, true)); err != nil {
		edgeSrv.Close()
		closeEdge()
		return nil, err
	}
	jctx, cancel := context.WithCancel(ctx)
	go e.Join(jctx, srv, jc)
	return func() { cancel(); edgeSrv.Close(); closeEdge() }, nil
}

func edgeCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dsec edge", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7071", "edge API address")
	data := fs.String("data", "/var/lib/dsec-edge", "node-local data directory")
	storeLoc := fs.String("store", "", "layer store shared with the control plane: a directory on a shared mount, or s3://ACCESS:SECRET@HOST:PORT/BUCKET[/PREFIX]")
	join := fs.String("join", os.Getenv("DSEC_JOIN"), "control plane URL to join and heartbeat to ($DSEC_JOIN)")
	advertise := fs.String("advertise", "", "URL the control plane reaches this edge at (default: http://<listen address>)")
	token := fs.String("token", os.Getenv("DSEC_EDGE_TOKEN"), "with --join: the cluster token; without: the bearer token the control plane must send ($DSEC_EDGE_TOKEN)")
	edgeToken := fs.String("edge-token", "", "with --join: the bearer token the control plane must send (default: a random one made at start)")
	var nf nodeFlags
	nf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *storeLoc == "" || *token == "" {
		return errors.New("dsec edge needs --store and --token")
	}
	log := nf.logger()
	bs, err := openBlobStore(ctx, *storeLoc, "", nf.nodeID)
	if err != nil {
		return err
	}
	st, err := layer.NewStore(bs, filepath.Join(*data, "tmp"))
	if err != nil {
		return err
	}
	layers, err := nf.nodeLayers(ctx, *data, *storeLoc, "", st, log)
	if err != nil {
		return err
	}
	e, closeEdge, err := nf.startEdge(ctx, *data, layers, log)
	if err != nil {
		return err
	}
	defer closeEdge()
	apiToken := *token
	if *join != "" {
		apiToken = *edgeToken
		if apiToken == "" {
			b := make([]byte, 20)
			rand.Read(b)
			apiToken = hex.EncodeToString(b)
		}
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	if *join != "" {
		labels, err := keyValues(nf.labels, "--label")
		if err != nil {
			return err
		}
		addr := *advertise
		if addr == "" {
			addr = "http://" + l.Addr().String()
		}
		cp, err := edge.NewJoinClient(*join, *token)
		if err != nil {
			return err
		}
		go e.Join(ctx, cp, edge.JoinConfig{Addr: addr, Token: apiToken, Labels: labels, Interval: nf.heartbeat})
		log.InfoContext(ctx, "joining control plane", "url", *join, "advertise", addr)
	}
	return serveListener(ctx, l, e.Handler(apiToken), log, "dsec edge ready", "node", nf.nodeID)
}

// serveHTTP serves h on addr until ctx ends, then shuts down gracefully.
// Sandboxes are never stopped by a shutdown.
func serveHTTP(ctx context.Context, addr string, h http.Handler, log *slog.Logger, msg string, attrs ...any) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return serveListener(ctx, l, h, log, msg, attrs...)
}

// serveListener is serveHTTP on a listener.
func serveListener(ctx context.Context, l net.Listener, h http.Handler, log *slog.Logger, msg string, attrs ...any) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	log.InfoContext(ctx, msg, append([]any{"addr", l.Addr().String()}, attrs...)...)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.InfoContext(ctx, "shutting down; sandboxes keep running")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	return nil
}

func defaultDataDir() string {
	if v := os.Getenv("DSEC_DATA"); v != "" {
		return v
	}
	return ".dsec"
}
