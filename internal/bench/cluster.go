package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/scheduler"
	"github.com/dsec-project/dsec/internal/server"
	"github.com/dsec-project/dsec/internal/sim"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/postgres"
	"github.com/dsec-project/dsec/internal/store/sqlite"
)

// ClusterConfig sets up `dsec bench cluster`.
type ClusterConfig struct {
	// Nodes is how many simulated nodes join; NodeCPU and NodeMemoryMB
	// are each one's capacity.
	Nodes        int
	NodeCPU      float64
	NodeMemoryMB int64
	// Duration and Concurrency shape the sustained create run through the
	// HTTP API.
	Duration    time.Duration
	Concurrency int
	// Batch is the size of the one batch placed in bulk; Live is how many
	// live sandboxes the cluster tracks when reads are timed.
	Batch, Live int
	// Stores are the stores to run against: "sqlite", "postgres".
	Stores []string
	// PostgresDSN is a database to use; empty starts a private server in
	// WorkDir (durable settings: fsync and synchronous commit on).
	PostgresDSN string
	WorkDir     string
	Out         io.Writer
}

// benchBase is the digest of the layer every simulated sandbox uses.
const benchBase = "sha256:" + "5151515151515151515151515151515151515151515151515151515151515151"

// Cluster runs the cluster benchmark against each store and prints its
// report. It is a simulation: the control plane, its HTTP API, scheduler
// and store are real; the nodes are real edges over a backend that runs
// nothing, reached in-process.
func Cluster(ctx context.Context, cfg ClusterConfig) error {
	w := cfg.Out
	fmt.Fprintf(w, "dsec bench cluster — SIMULATION: real control plane, HTTP API, scheduler and store; "+
		"%d simulated nodes (real edge code, a backend that runs nothing, reached in-process)\n", cfg.Nodes)
	fmt.Fprintf(w, "host: %d CPUs; node capacity %g cores × %gx overcommit, %d MB; %d clients for %s; batch %d; live target %d\n",
		runtime.NumCPU(), cfg.NodeCPU, scheduler.DefaultConfig.CPUOvercommit, cfg.NodeMemoryMB, cfg.Concurrency, cfg.Duration, cfg.Batch, cfg.Live)
	perSandbox := calibrateSim(ctx)
	fmt.Fprintf(w, "simulated nodes hold ~%d bytes of Go heap per sandbox (measured; subtracted below)\n", perSandbox)
	for _, kind := range cfg.Stores {
		if err := clusterRun(ctx, cfg, kind, perSandbox); err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
	}
	return nil
}

// clusterEnv is one control plane over simulated nodes.
type clusterEnv struct {
	// dbCPU is the CPU time of the database's own processes (a private
	// PostgreSQL), zero when the database runs in this process.
	dbCPU  func() time.Duration
	srv    *server.Server
	st     store.Store
	url    string
	tenant string
	client *client.Client
	// adminKey is for the admin routes the dashboard's overview calls.
	adminKey string
	sim      *sim.Cluster
	stop     func()
}

func openBenchStore(ctx context.Context, cfg ClusterConfig, kind, dir string) (store.Store, func(), func() time.Duration, error) {
	noCPU := func() time.Duration { return 0 }
	switch kind {
	case "sqlite":
		st, err := sqlite.Open(ctx, filepath.Join(dir, "dsec.db"))
		return st, func() {}, noCPU, err
	case "postgres":
		dsn, stop, cpu := cfg.PostgresDSN, func() {}, noCPU
		if dsn == "" {
			in, err := postgres.StartInstance(context.Background(), filepath.Join(dir, "pg"), false)
			if err != nil {
				return nil, nil, nil, err
			}
			stop, cpu = in.Stop, in.CPUTime
			if dsn, err = in.CreateDatabase(ctx, "dsec_bench"); err != nil {
				stop()
				return nil, nil, nil, err
			}
		}
		st, err := postgres.Open(ctx, dsn)
		if err != nil {
			stop()
			return nil, nil, nil, err
		}
		return st, stop, cpu, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown store %q (want sqlite or postgres)", kind)
}

func newClusterEnv(ctx context.Context, cfg ClusterConfig, kind, dir string) (*clusterEnv, error) {
	st, stopDB, dbCPU, err := openBenchStore(ctx, cfg, kind, dir)
	if err != nil {
		return nil, err
	}
	c := sim.NewCluster()
	rctx, cancel := context.WithCancel(ctx)
	srv := server.New(server.Config{
		Store: st, NewNodeClient: c.NewClient, Logger: slog.New(slog.DiscardHandler),
		NodeTimeout: time.Minute, // the host is saturated on purpose: no node may be declared down for it
	})
	env := &clusterEnv{srv: srv, st: st, sim: c, dbCPU: dbCPU}
	var hs *http.Server
	env.stop = func() {
		cancel()
		if hs != nil {
			hs.Close()
		}
		st.Close()
		stopDB()
	}
	key, err := server.Bootstrap(ctx, st, filepath.Join(dir, "admin.key"))
	if err != nil {
		env.stop()
		return nil, err
	}
	if err := st.PutLayer(ctx, store.Layer{Tenant: server.AdminTenant, Name: "base", Tag: "sim", Digest: benchBase,
		Kind: api.KindBase, Public: true, CreatedAt: time.Now().UTC()}); err != nil {
		env.stop()
		return nil, err
	}
	for i := range cfg.Nodes {
		if _, err := c.Add(ctx, fmt.Sprintf("sim-%03d", i), api.Resources{CPU: cfg.NodeCPU, MemoryMB: cfg.NodeMemoryMB}, nil); err != nil {
			env.stop()
			return nil, err
		}
	}
	if err := c.Heartbeat(ctx, srv); err != nil {
		env.stop()
		return nil, err
	}
	go func() {
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-tick.C:
				c.Heartbeat(rctx, srv)
			}
		}
	}()
	go srv.Run(rctx)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		env.stop()
		return nil, err
	}
	hs = &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(l)
	env.url = "http://" + l.Addr().String()
	admin := benchClient(env.url, key, cfg.Concurrency)
	t, err := admin.CreateTenant(ctx, "bench")
	if err != nil {
		env.stop()
		return nil, err
	}
	k, err := admin.CreateKey(ctx, t.ID, false)
	if err != nil {
		env.stop()
		return nil, err
	}
	env.tenant, env.client, env.adminKey = t.ID, benchClient(env.url, k.Secret, cfg.Concurrency), key
	return env, nil
}

// benchClient is a Go client that keeps a connection per concurrent
// caller alive.
func benchClient(url, key string, conc int) *client.Client {
	return client.New(url, key, client.WithHTTPClient(&http.Client{Transport: &http.Transport{
		MaxIdleConns: conc * 2, MaxIdleConnsPerHost: conc * 2, IdleConnTimeout: time.Minute,
	}}))
}

func simRequest() *api.CreateSandboxRequest {
	return &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:sim"}, Resources: api.Resources{CPU: 1, MemoryMB: 512}}
}

// loadResult is a timed run of one call in a loop.
type loadResult struct {
	n    int64
	errs int64
	wall time.Duration
	lat  stats
	ids  []string
}

// hammer runs call from conc goroutines for d and times each call.
func hammer(ctx context.Context, conc int, d time.Duration, call func() (string, error)) (loadResult, error) {
	var n, errs atomic.Int64
	var mu sync.Mutex
	var lats []time.Duration
	var ids []string
	var firstErr error
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			var myIDs []string
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				id, err := call()
				mine = append(mine, time.Since(t0))
				if err != nil {
					if errs.Add(1) == 1 {
						mu.Lock()
						firstErr = err
						mu.Unlock()
					}
					continue
				}
				n.Add(1)
				if id != "" {
					myIDs = append(myIDs, id)
				}
			}
			mu.Lock()
			lats = append(lats, mine...)
			ids = append(ids, myIDs...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	r := loadResult{n: n.Load(), errs: errs.Load(), wall: time.Since(start), lat: summarize(lats), ids: ids}
	if r.n == 0 && firstErr != nil {
		return r, firstErr
	}
	return r, nil
}

func (r loadResult) rate() float64 { return float64(r.n) / r.wall.Seconds() }

// calibrateSim measures the Go heap the simulated nodes keep per sandbox,
// so that the control plane's own memory can be told apart.
func calibrateSim(ctx context.Context) int64 {
	const n = 20000
	c := sim.NewCluster()
	node, err := c.Add(ctx, "calibrate", api.Resources{CPU: 1, MemoryMB: 1}, nil)
	if err != nil {
		return 0
	}
	before := heapInuse()
	cl, _ := c.NewClient(node.Addr(), "sim-token-calibrate")
	for i := range n {
		cl.Create(ctx, edgeCreate(fmt.Sprintf("sb-cal%07d", i)))
	}
	after := heapInuse()
	runtime.KeepAlive(node)
	return max(0, (after-before)/n)
}

func heapInuse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// rssBytes is the process's resident memory.
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, rss int64
	fmt.Sscan(string(b), &size, &rss)
	return rss * int64(os.Getpagesize())
}

func dirBytes(dir string) int64 {
	var total int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			total += fi.Size()
		}
		return nil
	})
	return total
}

// bigFiles lists the files of dir over 16 MB with their sizes.
func bigFiles(dir string) string {
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && fi.Size() > 16<<20 {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel+" "+mib(fi.Size()))
		}
		return nil
	})
	return strings.Join(out, ", ")
}

func mib(b int64) string { return fmt.Sprintf("%.0f MB", float64(b)/(1<<20)) }

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
