package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/reqid"
)

// Config is what the agent is started with.
type Config struct {
	// Root is the directory file operations resolve beneath: "/" in a
	// sandbox, a temporary directory in tests.
	Root string
	// MaxFileBytes caps a file read or written through the API.
	MaxFileBytes int64
	// ShutdownGrace is how long processes get between the forwarded
	// signal and SIGKILL.
	ShutdownGrace time.Duration
	Version       string
	Log           *slog.Logger
	// NoConfine runs commands without Landlock: for tests outside a
	// sandbox only.
	NoConfine bool
	// Freezer, if set, serves POST /fs/freeze and /fs/thaw (a microVM's
	// writable disk, for snapshots).
	Freezer Freezer
	// Identity serves POST /identity, which renames the machine (a
	// microVM's guest, whose memory a fork copied).
	Identity bool
	// CommandFilter is the seccomp program every command runs under, on
	// top of the agent's own (nil: the agent's alone).
	CommandFilter []byte
	// DropAdmin forks commands from threads without CAP_SYS_ADMIN in any
	// capability set: the container init keeps it for resets, commands
	// must never have it.
	DropAdmin bool
	// Filtered says the agent's own seccomp filter is loaded.
	Filtered bool
	// MaxPortConns bounds the connections open at once to the sandbox's
	// ports (DefaultMaxPortConns if zero).
	MaxPortConns int
	// Carried is the state a previous agent handed over on a reset.
	Carried *Carried
	// Reexec replaces the process with a new agent serving on listenFD,
	// handing it stateFD (see Carried); it returns only on failure. Nil:
	// this agent cannot reset in place.
	Reexec func(listenFD, stateFD int) error
}

// Health is the body of GET /healthz.
type Health struct {
	OK      bool   `json:"ok"`
	Pid     int    `json:"pid"`
	Version string `json:"version"`
	// Instance is random per agent process image: it changes when a
	// reset re-executes the agent.
	Instance string `json:"instance,omitempty"`
}

// Server is the agent. There is at most one per process: it is the
// process's reaper.
type Server struct {
	cfg    Config
	root   int // O_PATH fd of cfg.Root
	reaper *reaper
	procs  *procTable
	ports  portConns
	http   *http.Server
	reqs   atomic.Int64
	// used: a request besides a health check, a reset or a cgroup
	// placement reached this process. A reset of an unused agent (a
	// blank sandbox of the node's pool being claimed) keeps the process:
	// it holds nothing a tenant left (see handleReset).
	used atomic.Bool
	// noConfine turns Landlock off (tests that run the agent outside a
	// sandbox).
	noConfine bool
	// protected: PID 1 of a sandbox, whose OOM score the edge lowers;
	// commands get theirs back to 0.
	protected bool

	// inputMu keeps input requests from interleaving on the screen.
	inputMu sync.Mutex

	lmu      sync.Mutex
	listener net.Listener // what Serve serves, for a reset's re-exec

	// policyMu guards the current phase's rules and its spawner.
	policyMu sync.Mutex
	files    FileRules
	phase    string
	spawner  *spawner // nil until the phase's first command
	// cmdTasks are the "tasks" files of the cgroup v1 cgroups commands
	// run in (none: commands share the agent's cgroups): each spawner
	// thread joins them, so its forks start there.
	cmdTasks []int
}

// New makes the calling process the agent: non-dumpable, the reaper of its
// children (and a subreaper when it is not PID 1), ready to serve.
func New(cfg Config) (*Server, error) {
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = 100 << 20
	}
	if cfg.MaxPortConns <= 0 {
		cfg.MaxPortConns = DefaultMaxPortConns
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	root, err := unix.Open(cfg.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", cfg.Root, err)
	}
	s := &Server{cfg: cfg, root: root, procs: newProcTable(), noConfine: cfg.NoConfine}
	s.ports.max = int64(cfg.MaxPortConns)
	if c := cfg.Carried; c != nil {
		s.phase, s.files = c.Phase, c.Files
	}
	s.protected = os.Getpid() == 1
	// Fail now rather than on every file request if the kernel or a
	// seccomp profile lacks openat2.
	fd, err := s.openIn(".", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		unix.Close(root)
		return nil, fmt.Errorf("openat2 root %s: %w", cfg.Root, err)
	}
	unix.Close(fd)
	if err := setupProcess(); err != nil {
		unix.Close(root)
		return nil, err
	}
	// Commands' shared stdin, open from the start like the agent's other
	// descriptors (a failure shows again at the first command).
	_, _ = devNull()
	if s.reaper, err = newReaper(); err != nil {
		unix.Close(root)
		return nil, err
	}
	s.http = &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(cfg.Log.Handler(), slog.LevelWarn),
		ConnContext:       connContext,
	}
	return s, nil
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.HandleFunc("POST /exec", s.handleExec)
	mux.HandleFunc("GET /procs", s.handleListProcs)
	mux.HandleFunc("GET /procs/{id}", s.handleGetProc)
	mux.HandleFunc("DELETE /procs/{id}", s.handleDeleteProc)
	mux.HandleFunc("GET /procs/{id}/wait", s.handleWait)
	mux.HandleFunc("GET /procs/{id}/output", s.handleOutput)
	mux.HandleFunc("POST /procs/{id}/signal", s.handleSignal)
	mux.HandleFunc("POST /procs/{id}/stdin", s.handleStdin)
	mux.HandleFunc("POST /procs/{id}/stdin/close", s.handleCloseStdin)
	mux.HandleFunc("DELETE /procs/{id}/stdin", s.handleCloseStdin)
	mux.HandleFunc("POST /procs/{id}/resize", s.handleResize)
	mux.HandleFunc("GET /files", s.handleGetFile)
	mux.HandleFunc("PUT /files", s.handlePutFile)
	mux.HandleFunc("DELETE /files", s.handleDeleteFile)
	mux.HandleFunc("GET /policy", s.handleGetPolicy)
	mux.HandleFunc("PUT /policy", s.handlePutPolicy)
	if s.cfg.Freezer != nil {
		mux.HandleFunc("POST /fs/freeze", s.handleFreeze)
		mux.HandleFunc("POST /fs/thaw", s.handleThaw)
	}
	if s.cfg.Identity {
		mux.HandleFunc("POST /identity", s.handleIdentity)
	}
	mux.HandleFunc("POST /reset", s.handleReset)
	mux.HandleFunc("POST /cgroup", s.handlePlaceCommands)
	mux.HandleFunc("GET /terminal", s.handleTerminal)
	mux.HandleFunc("/ports/{port}/{rest...}", s.handlePortProxy)
	mux.HandleFunc("GET /tcp/{port}", s.handleTunnel)
	mux.HandleFunc("GET /display", s.handleDisplay)
	mux.HandleFunc("GET /screen", s.handleScreen)
	mux.HandleFunc("POST /input", s.handleInput)
	mux.HandleFunc("GET /vnc", s.handleVNC)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errdefs.NotFound("route %s %s", r.Method, r.URL.Path))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The edge's request id (the API call's) if it sent one, so that
		// the call can be followed from the server to here.
		id := r.Header.Get(reqid.Header)
		if !reqid.Valid(id) {
			id = fmt.Sprintf("r-%d", s.reqs.Add(1))
		}
		switch r.URL.Path {
		case "/healthz", "/reset", "/cgroup":
		default:
			s.used.Store(true)
		}
		log := s.cfg.Log.With(reqid.Attr, id)
		ctx := context.WithValue(reqid.With(r.Context(), id), loggerKey{}, log)
		mux.ServeHTTP(w, r.WithContext(ctx))
	})
}

// Serve answers requests on l until Shutdown. How l was obtained (an
// inherited fd, a path, a vsock) is the caller's business.
func (s *Server) Serve(l net.Listener) error {
	s.cfg.Log.Info("serving", "addr", l.Addr().String(), "pid", os.Getpid(), "root", s.cfg.Root)
	s.lmu.Lock()
	s.listener = l
	s.lmu.Unlock()
	return s.http.Serve(fdListener{l})
}

// Shutdown forwards sig to every process group the agent started and still
// runs, gives them ShutdownGrace to exit, kills what is left and stops
// serving; Serve then returns http.ErrServerClosed. Groups whose leader
// already exited are not tracked; as PID 1 the kernel kills them when the
// agent exits.
func (s *Server) Shutdown(sig os.Signal) {
	ssig, ok := sig.(syscall.Signal)
	if !ok {
		ssig = syscall.SIGTERM
	}
	kids := s.reaper.stop()
	s.cfg.Log.Info("shutting down", "signal", unix.SignalName(ssig), "processes", len(kids))
	for _, c := range kids {
		c.signalGroup(ssig)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace)
	defer cancel()
	for _, c := range kids {
		select {
		case <-c.done:
		case <-ctx.Done():
		}
	}
	for _, c := range kids {
		c.signalGroup(unix.SIGKILL)
	}
	s.http.Close()
}

// Close releases what New took, in reverse. Call it after Serve returns.
func (s *Server) Close() error {
	s.reaper.close()
	return unix.Close(s.root)
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, &Health{OK: true, Pid: os.Getpid(), Version: s.cfg.Version, Instance: instance})
}

// instance names this process image (see Health).
var instance = func() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

type loggerKey struct{}

// logger is the request's logger, with its request attribute.
func logger(r *http.Request) *slog.Logger {
	if l, ok := r.Context().Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return slog.New(slog.DiscardHandler) // not reached: routes sets it
}

// writeJSON answers with v and its length: an answer of known length goes
// through the edge's proxy in one write (a chunked one, as an exec result
// over 2 KB would be, is flushed piece by piece).
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(&api.ErrorResponse{Error: &api.Error{Code: api.CodeInternal, Message: "encode answer: " + err.Error()}})
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b) // the client is gone
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code := errdefs.Code(err)
	if code == api.CodeInternal {
		logger(r).ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, api.HTTPStatus(code), &api.ErrorResponse{Error: &api.Error{Code: code, Message: err.Error()}})
}

// decodeJSON reads exactly one JSON value into v, refusing unknown fields,
// values of the wrong type, trailing data and bodies over limit bytes.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// Reading to EOF also lets the server notice a client that leaves.
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON body")
		}
	}
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &mbe):
		return fmt.Errorf("request body over %d bytes: %w", limit, errdefs.ErrTooLarge)
	case errors.Is(err, io.EOF):
		return errdefs.Invalid("empty request body")
	default:
		return errdefs.Invalid("request body: %v", err)
	}
}
