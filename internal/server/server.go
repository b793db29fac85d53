// Package server is the control plane: the public HTTP API under /v1, API
// key authentication and tenant scoping, the sandbox and layer registry (in
// a store.Store), placement through the scheduler, and the calls to the
// edges that build and run sandboxes. It keeps sandboxes' leases (renew,
// idle timeout) and reaps those that ran out, runs execs that are steps of
// a trajectory and keeps their log, checkpoints trajectories and restores
// their sandboxes from checkpoints (collecting the layers of dead ones),
// and, on start, reconciles its records with what the nodes really run.
//
// The server must never run sandbox code or mount anything itself, and a
// tenant must never learn that another tenant's sandbox or layer exists:
// such lookups answer 404, exactly like a missing one.
package server

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/admission"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/fncall"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/reqid"
	"github.com/dsec-project/dsec/internal/scheduler"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/ui"
)

// Config configures the control plane.
type Config struct {
	// URLSigningKey signs port URLs; replicas must share it (random, and
	// so good for this process only, if empty).
	URLSigningKey []byte
	Store         store.Store
	Scheduler     *scheduler.Scheduler
	// Layers is the shared layer store uploads go to; TmpDir is where uploads are
	// unpacked and built (on the same filesystem).
	Layers *layer.Store
	TmpDir string
	// MaxLayerBytes bounds a layer upload.
	MaxLayerBytes int64
	// MaxSnapshotDepth is how many snapshot layers may stack before a
	// snapshot flattens them; DefaultMaxSnapshotDepth if zero.
	MaxSnapshotDepth int
	// Defaults fill the resources a create leaves out.
	Defaults api.Resources
	// DefaultTTL applies when a create gives no ttl_seconds; MaxTTL bounds it
	// and every renew.
	DefaultTTL, MaxTTL time.Duration
	// DefaultIdleTimeout applies when a create gives no
	// idle_timeout_seconds; zero means sandboxes are not reaped for idling.
	DefaultIdleTimeout time.Duration
	// TrajectoryRetention is how long a trajectory is kept after its
	// newest step started; 7 days by default.
	TrajectoryRetention time.Duration
	// CheckpointsKept is how many checkpoints a trajectory keeps;
	// DefaultCheckpointsKept if zero.
	CheckpointsKept int
	// KeepLayerObjects makes the collection of dead checkpoints delete
	// their layer records only, leaving the objects in the layer store:
	// for control planes with several replicas, whose layer writes a
	// removal in this process cannot be serialised with.
	KeepLayerObjects bool
	// BuildCacheTTL is how long a Dockerfile step's cache layer that no
	// layer stacks on is kept after a build last used it;
	// DefaultBuildCacheTTL if zero. Fork layers go once their copies do.
	BuildCacheTTL time.Duration
	// ForkLayerGrace is how long a fork's layer is kept before it is
	// collected once unused (a fork in flight has made its layer before
	// its copies are recorded); DefaultForkLayerGrace if zero.
	ForkLayerGrace time.Duration
	// ReapInterval is how often expired sandboxes are looked for.
	ReapInterval time.Duration
	// BatchParallel bounds the sandboxes of one batch built at once on
	// each node.
	BatchParallel int
	// FnCall sizes the warm pools behind the fncall backend.
	FnCall fncall.Config
	// Profiles are named sets of policy phases a create can refer to;
	// DefaultProfiles are always offered.
	Profiles map[string]api.Profile
	// ClusterToken authenticates nodes joining and heartbeating over HTTP
	// (POST /v1/cluster/heartbeat); empty, no node can join that way.
	ClusterToken string
	// NodeTimeout is how long a node may go unheard before it is declared
	// down and its sandboxes lost; 10 s by default.
	NodeTimeout time.Duration
	// SyncInterval is how often this replica re-reads the nodes from the
	// store and looks for silent ones; 1 s by default.
	SyncInterval time.Duration
	// NewNodeClient makes the client of a node's edge API; edge.NewClient
	// by default (the cluster benchmark reaches its simulated nodes
	// in-process).
	NewNodeClient func(addr, token string) (*edge.Client, error)
	// Compat configures the E2B, SandboxFusion and SWE-ReX surfaces.
	Compat CompatConfig
	Logger *slog.Logger
}

// Server is the control plane.
type Server struct {
	cfg     Config
	store   store.Store
	sched   *scheduler.Scheduler
	auth    *authenticator
	log     *slog.Logger
	metrics *metrics
	stats   statsRing // the dashboard's last hour of rates
	nodes   *registry
	// refusedAt is when a node refused for its edge protocol was last
	// logged (node id → time.Time): once a minute, not every heartbeat.
	refusedAt sync.Map
	routes    *routes // running sandboxes' records for the commands' path
	fncall    *fncall.Manager
	layers    layerCache

	acts  *activity
	steps *steps
	// urlKey signs port URLs; conns are the long-lived connections to
	// sandboxes passed through (terminals, ports, tunnels).
	urlKey []byte
	conns  liveConns
	gates  *gates
	// configs caches the configs of built layers (see buildresult.go).
	configs configCache

	// layerMu is held shared by layer writes and exclusively by the
	// removal of layers (see layergc.go).
	layerMu sync.RWMutex
	// chunks caches layers' chunk sets for usage reports.
	chunks chunkSets
	gcKick chan struct{}

	// admission holds creates waiting for busy nodes (admission.go).
	admission *admission.Queue

	// started is when New made the server: pool sandboxes created
	// before it are a previous run's (destroyStalePools).
	started time.Time
}

// New returns a control plane over cfg.Store.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = reqid.Logger(cfg.Logger)
	if cfg.Defaults == (api.Resources{}) {
		cfg.Defaults = api.Resources{CPU: 1, MemoryMB: 512, DiskMB: 10240, Pids: 1024}
	}
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL = 24 * time.Hour
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = 7 * 24 * time.Hour
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.TrajectoryRetention == 0 {
		cfg.TrajectoryRetention = 7 * 24 * time.Hour
	}
	if cfg.MaxLayerBytes == 0 {
		cfg.MaxLayerBytes = 16 << 30
	}
	if cfg.BatchParallel <= 0 {
		cfg.BatchParallel = 8
	}
	if cfg.CheckpointsKept <= 0 {
		cfg.CheckpointsKept = DefaultCheckpointsKept
	}
	if cfg.MaxSnapshotDepth <= 0 {
		cfg.MaxSnapshotDepth = DefaultMaxSnapshotDepth
	}
	if cfg.Scheduler == nil {
		cfg.Scheduler = scheduler.New(scheduler.DefaultConfig)
	}
	profiles := DefaultProfiles()
	maps.Copy(profiles, cfg.Profiles)
	cfg.Profiles = profiles
	if cfg.NodeTimeout == 0 {
		cfg.NodeTimeout = 10 * time.Second
	}
	if cfg.SyncInterval == 0 {
		cfg.SyncInterval = time.Second
	}
	if cfg.NewNodeClient == nil {
		cfg.NewNodeClient = edge.NewClient
	}
	routes := newRoutes()
	s := &Server{
		started: time.Now().UTC(),
		urlKey:  cfg.URLSigningKey,
		cfg:     cfg,
		store:   routeStore{Store: cfg.Store, routes: routes},
		routes:  routes,
		sched:   cfg.Scheduler,
		auth:    &authenticator{store: cfg.Store, ttl: 10 * time.Second, cache: map[string]cachedKey{}},
		log:     cfg.Logger,
		metrics: newMetrics(),
		nodes:   newRegistry(),
		acts:    newActivity(),
		steps:   newSteps(),
		gates:   newGates(),
		gcKick:  make(chan struct{}, 1),

		admission: admission.New(admissionPoll),
	}
	s.registerAdmissionMetrics()
	s.registerBlankPoolMetrics()
	if len(s.urlKey) == 0 {
		s.urlKey = make([]byte, 32)
		rand.Read(s.urlKey)
	}
	if cfg.FnCall.Logger == nil {
		cfg.FnCall.Logger = cfg.Logger
	}
	s.fncall = fncall.New(cfg.FnCall, poolRuntime{s})
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dsec_cluster_utilisation", Help: "Utilisation of the regular (non-burst) nodes, 0..1.",
	}, s.sched.Utilisation))
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dsec_sandboxes_live", Help: "Sandboxes placed on nodes.",
	}, func() float64 {
		n := 0
		for _, ns := range s.sched.Nodes() {
			n += ns.Sandboxes
		}
		return float64(n)
	}))
	return s
}

// DrainFnCall destroys the FnCall pools' sandboxes, waiting for those in
// a call until ctx ends: at a graceful stop, while the nodes can still be
// reached (a pool lives only in this process, so its sandboxes would run
// on until the next start destroyed them). Later calls fail as
// unavailable.
func (s *Server) DrainFnCall(ctx context.Context) error {
	return s.fncall.Close(ctx)
}

// Run keeps the view of the nodes current (and declares silent ones down),
// reaps expired and idle sandboxes, keeps the activity of busy ones
// current in the store, purges old records and trajectories, and resizes
// the FnCall pools, until ctx ends. Call it after the nodes are added.
func (s *Server) Run(ctx context.Context) {
	s.syncNodes(ctx, true)
	go s.runNodeSync(ctx)
	s.destroyStalePools(ctx)
	go s.fncall.Run(ctx)
	tick := time.NewTicker(s.cfg.ReapInterval)
	defer tick.Stop()
	// Trajectories are purged at a tenth of their retention, at most
	// hourly, so a short retention (in tests) is honoured promptly.
	gcEvery := min(max(s.cfg.TrajectoryRetention/10, s.cfg.ReapInterval), time.Hour)
	go s.runGC(ctx, gcEvery)
	go s.runStats(ctx)
	lastPurge, lastGC := time.Now(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.reap(ctx)
		s.touchBusy(ctx)
		if time.Since(lastPurge) > time.Hour {
			lastPurge = time.Now()
			if n, err := s.store.PurgeSandboxes(ctx, time.Now().Add(-24*time.Hour)); err == nil && n > 0 {
				s.log.InfoContext(ctx, "purged records of deleted sandboxes", "count", n)
			}
		}
		if time.Since(lastGC) >= gcEvery {
			lastGC = time.Now()
			n, err := s.store.PurgeTrajectories(ctx, time.Now().Add(-s.cfg.TrajectoryRetention))
			switch {
			case err != nil:
				s.log.WarnContext(ctx, "purge trajectories", "err", err)
			case n > 0:
				s.log.InfoContext(ctx, "purged old trajectory steps", "count", n)
				s.kickGC() // their checkpoints are dead now
			}
		}
	}
}

// Handler is the public HTTP API.
func (s *Server) Handler() http.Handler {
	mux := &routeMux{ServeMux: http.NewServeMux()}
	authed := func(pattern string, h func(http.ResponseWriter, *http.Request) error) {
		mux.Handle(pattern, s.instrument(pattern, s.authenticated(h, false)))
	}
	admin := func(pattern string, h func(http.ResponseWriter, *http.Request) error) {
		mux.Handle(pattern, s.instrument(pattern, s.authenticated(h, true)))
	}

	authed("POST /v1/sandboxes", s.createSandbox)
	authed("GET /v1/sandboxes", s.listSandboxes)
	authed("POST /v1/sandboxes:batch", s.createBatch)
	authed("GET /v1/sandboxes:count", s.countSandboxes)
	authed("GET /v1/sandboxes/{id}", s.getSandbox)
	authed("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	authed("POST /v1/sandboxes/{id}/exec", s.exec)
	authed("GET /v1/sandboxes/{id}/files", s.files)
	authed("PUT /v1/sandboxes/{id}/files", s.files)
	authed("DELETE /v1/sandboxes/{id}/files", s.files)
	authed("GET /v1/sandboxes/{id}/processes", s.processes)
	authed("/v1/sandboxes/{id}/processes/{rest...}", s.processes)
	authed("POST /v1/sandboxes/{id}/reset", s.resetSandbox)
	authed("POST /v1/sandboxes/{id}/snapshot", s.snapshotSandbox)
	authed("POST /v1/sandboxes/{id}/fork", s.forkSandbox)
	authed("POST /v1/sandboxes/{id}/pause", s.pauseSandbox)
	authed("POST /v1/sandboxes/{id}/resume", s.resumeSandbox)
	authed("POST /v1/sandboxes/{id}/renew", s.renewSandbox)
	authed("GET /v1/trajectories/{id...}", s.getTrajectory)
	authed("DELETE /v1/trajectories/{id...}", s.deleteTrajectory)
	authed("POST /v1/trajectories:restore", s.restoreTrajectory)
	authed("PUT /v1/sandboxes/{id}/phase", s.setPhase)

	// Interactive sandboxes: terminals, ports, live logs.
	// The terminal and VNC WebSockets also take a signed one-minute URL's
	// token instead of a key: a browser cannot set a WebSocket's headers.
	mux.Handle("GET /v1/sandboxes/{id}/terminal", s.instrument("GET /v1/sandboxes/{id}/terminal", s.keyOrToken("terminal", s.terminal)))
	authed("POST /v1/sandboxes/{id}/terminal/url", s.wsURL("terminal"))
	authed("POST /v1/sandboxes/{id}/vnc/url", s.wsURL("vnc"))
	authed("POST /v1/sandboxes/{id}/ports/{port}/url", s.portURL)
	authed("GET /v1/sandboxes/{id}/tcp/{port}", s.tunnel)
	// A key or a signed URL's token: it authenticates by itself.
	mux.Handle("/v1/sandboxes/{id}/ports/{port}/{path...}", s.instrument("/v1/sandboxes/{id}/ports/{port}/{path...}", s.portProxy))

	authed("GET /v1/sandboxes/{id}/screen", s.toEdgeDisplay)
	authed("POST /v1/sandboxes/{id}/input", s.toEdgeDisplay)
	mux.Handle("GET /v1/sandboxes/{id}/vnc", s.instrument("GET /v1/sandboxes/{id}/vnc", s.keyOrToken("vnc", s.toEdgeDisplay)))
	authed("GET /v1/profiles", s.listProfiles)

	authed("POST /v1/fncall", s.fncallCall)
	authed("GET /v1/fncall/pools", s.listPools)
	authed("POST /v1/fncall/pools", s.warmPool)

	authed("POST /v1/layers", s.createLayer)
	authed("GET /v1/layers", s.listLayers)
	authed("GET /v1/layers/{ref...}", s.getLayer)
	authed("POST /v1/layers:build", s.buildLayer)

	admin("POST /v1/tenants", s.createTenant)
	admin("GET /v1/tenants", s.listTenants)
	admin("POST /v1/tenants/{id}/keys", s.createKey)
	admin("GET /v1/tenants/{id}/keys", s.listKeys)
	admin("DELETE /v1/keys/{id}", s.deleteKey)
	admin("GET /v1/tenants/{id}", s.getTenant)
	admin("PUT /v1/tenants/{id}/quota", s.setQuota)
	admin("GET /v1/stats", s.getStats)
	admin("GET /v1/nodes", s.listNodes)
	admin("GET /v1/nodes/{id}", s.getNode)
	admin("POST /v1/nodes/{id}/drain", s.drainNode)
	admin("POST /v1/nodes/{id}/undrain", s.undrainNode)

	// Nodes authenticate with the cluster token, not an API key.
	mux.Handle("POST /v1/cluster/heartbeat", s.instrument("POST /v1/cluster/heartbeat", s.heartbeat))

	s.compatRoutes(mux)

	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "nodes": s.nodes.count()})
	})
	// The dashboard's static assets hold no data: the pages call /v1 with
	// the user's key, under the same auth and tenant checks as any client.
	mux.Handle("GET /ui/", ui.Handler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.Handle("/", s.instrument("unmatched", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, r, errdefs.NotFound("no route %s %s", r.Method, r.URL.Path))
	}))
	s.withE2B(mux)
	return mux
}

// queryBool reads a boolean query parameter: absent is false; a value
// strconv.ParseBool does not take is an error.
func queryBool(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.Invalid("query parameter %s=%q: want true or false", name, v)
	}
	return b, nil
}

// authenticated wraps a handler that returns an error: it checks the key,
// puts the principal in the context, and writes the error if any.
func (s *Server) authenticated(h func(http.ResponseWriter, *http.Request) error, adminOnly bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.auth.authenticate(r)
		if err == nil && adminOnly && !p.Admin {
			err = fmt.Errorf("this call needs an admin key: %w", errdefs.ErrPermissionDenied)
		}
		if err == nil {
			r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
			err = h(w, r)
		}
		if err != nil {
			httpapi.WriteError(w, r, err)
		}
	}
}

// instrument gives each request its id (package reqid), counts, times and
// logs requests by route (at debug level), and turns a panic into a 500
// rather than a dropped connection.
func (s *Server) instrument(route string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		r = reqid.Request(w, r)
		r = r.WithContext(httpapi.WithLogger(r.Context(), s.log))
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			s.log.DebugContext(r.Context(), "request", "method", r.Method, "route", route, "status", sw.status, "duration", time.Since(start))
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.ErrorContext(r.Context(), "panic in handler", "route", route, "panic", v, "stack", string(debug.Stack()))
				if !sw.wrote {
					httpapi.WriteJSON(sw, http.StatusInternalServerError, api.ErrorResponse{Error: &api.Error{
						Code: api.CodeInternal, Message: "internal error"}})
				}
			}
			s.metrics.requests.WithLabelValues(route, strconv.Itoa(sw.status)).Inc()
			s.metrics.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
		}()
		h(sw, r)
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush and deadlines.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		w.wrote = true
		f.Flush()
	}
}

type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	creates   *prometheus.CounterVec
	createDur prometheus.Histogram
	steps     *prometheus.CounterVec

	checkpoints          *prometheus.CounterVec
	checkpointDur        prometheus.Histogram
	checkpointsCollected prometheus.Counter
	admissionWait        *prometheus.HistogramVec
}

func newMetrics() *metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsec_http_requests_total", Help: "API requests by route and status.",
		}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsec_http_request_seconds", Help: "API request latency by route.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}, []string{"route"}),
		creates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsec_sandbox_creates_total", Help: "Sandbox creates by backend and result.",
		}, []string{"backend", "result"}),
		createDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dsec_sandbox_create_seconds", Help: "Time to create a sandbox, placement to running.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
	}
	m.steps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dsec_trajectory_steps_total", Help: "Trajectory steps by what was done: run, rerun, diverge, replay, settle.",
	}, []string{"action"})
	m.checkpoints = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dsec_trajectory_checkpoints_total", Help: "Trajectory checkpoints by result: ok, skipped, failed.",
	}, []string{"result"})
	m.checkpointDur = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "dsec_trajectory_checkpoint_seconds", Help: "Time to take a checkpoint, the step's end to the record.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
	})
	m.checkpointsCollected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dsec_trajectory_checkpoints_collected_total", Help: "Dead checkpoints whose layers were collected.",
	})
	reg.MustRegister(m.requests, m.latency, m.creates, m.createDur, m.steps,
		m.checkpoints, m.checkpointDur, m.checkpointsCollected)
	return m
}
