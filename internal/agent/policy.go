package agent

import (
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// Policy is the body of GET and PUT /policy: the rules every command
// started from now on runs under.
type Policy struct {
	Phase string    `json:"phase,omitempty"`
	Files FileRules `json:"files"`
}

// maxRulePaths bounds the paths of one policy.
const maxRulePaths = 256

func (s *Server) handleGetPolicy(w http.ResponseWriter, r *http.Request) {
	s.policyMu.Lock()
	p := Policy{Phase: s.phase, Files: s.files}
	s.policyMu.Unlock()
	writeJSON(w, http.StatusOK, &p)
}

// handlePutPolicy replaces the rules. Commands already running keep the
// rules they started with; every command started after the answer gets
// the new ones.
func (s *Server) handlePutPolicy(w http.ResponseWriter, r *http.Request) {
	var p Policy
	if err := decodeJSON(w, r, &p, 1<<20); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := ValidateFileRules(p.Files); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.policyMu.Lock()
	s.phase, s.files = p.Phase, p.Files
	if s.spawner != nil {
		s.spawner.stop()
		s.spawner = nil
	}
	s.policyMu.Unlock()
	logger(r).InfoContext(r.Context(), "policy", "phase", p.Phase, "deny", len(p.Files.Deny), "read_only", len(p.Files.ReadOnly))
	writeJSON(w, http.StatusOK, &p)
}

// ValidateFileRules checks that every path is absolute, without '..', and
// that there are not too many.
func ValidateFileRules(f FileRules) error {
	if len(f.Deny)+len(f.ReadOnly) > maxRulePaths {
		return errdefs.Invalid("at most %d file rule paths", maxRulePaths)
	}
	for _, p := range append(append([]string{}, f.Deny...), f.ReadOnly...) {
		if !filepath.IsAbs(p) || hasNUL(p) || strings.Contains(p+"/", "/../") || len(p) > 4096 {
			return errdefs.Invalid("file rule path %q: want an absolute path without '..'", p)
		}
		if filepath.Clean(p) == "/" {
			return errdefs.Invalid("file rule path %q: the root itself cannot be restricted", p)
		}
	}
	return nil
}

type forkFunc func(argv0 string, argv []string, attr *syscall.ProcAttr) (int, error)

// forker returns how the next command is forked: from the current phase's
// spawner thread, which Landlock confines to the phase's file rules (and,
// where the kernel has it, scopes signals and abstract sockets, so that no
// command can signal the agent). All commands of one phase share its
// domain and so can signal each other.
func (s *Server) forker() forkFunc {
	if s.noConfine {
		return nil
	}
	return func(argv0 string, argv []string, attr *syscall.ProcAttr) (int, error) {
		// Held across the fork: a phase change waits for it, and no fork
		// reaches a stopped spawner.
		s.policyMu.Lock()
		defer s.policyMu.Unlock()
		if s.spawner == nil {
			sp, err := newSpawner(s.cfg.Root, s.files, s.cfg.DropAdmin, s.cfg.CommandFilter, s.cmdTasks)
			if err != nil {
				return 0, &confineError{err}
			}
			s.spawner = sp
		}
		return s.spawner.fork(argv0, argv, attr)
	}
}

// prepareSpawner starts the current phase's spawner if there is none yet,
// so that the next command does not wait for it. A failure is only logged:
// the next command tries again and reports it.
func (s *Server) prepareSpawner(log *slog.Logger) {
	s.policyMu.Lock()
	defer s.policyMu.Unlock()
	if s.spawner != nil || s.noConfine {
		return
	}
	sp, err := newSpawner(s.cfg.Root, s.files, s.cfg.DropAdmin, s.cfg.CommandFilter, s.cmdTasks)
	if err != nil {
		log.Warn("prepare the commands' spawner", "err", err)
		return
	}
	s.spawner = sp
}

// spawner is an OS thread confined once to a phase's rules, forking that
// phase's commands. When the phase ends its thread exits and is gone.
type spawner struct {
	reqs chan spawnReq
}

type spawnReq struct {
	argv0 string
	argv  []string
	attr  *syscall.ProcAttr
	res   chan spawnRes
}

type spawnRes struct {
	pid int
	err error
}

// newSpawner starts a spawner thread: it moves itself into the commands'
// cgroup v1 cgroups whose tasks files are tasks (cpu, pids); with
// noAdmin it gives up CAP_SYS_ADMIN (which a container's agent keeps for
// resets), confines itself with Landlock to rules and, if filter is set,
// installs the commands' seccomp filter on top of the agent's. Every
// command inherits all of it.
func newSpawner(root string, rules FileRules, noAdmin bool, filter []byte, tasks []int) (*spawner, error) {
	sp := &spawner{reqs: make(chan spawnReq)}
	ready := make(chan error, 1)
	serve := func(taken chan<- struct{}) {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if taken != nil {
			close(taken)
		}
		if noAdmin {
			if err := dropAdmin(); err != nil {
				ready <- err
				return
			}
		}
		if err := restrictThread(root, rules); err != nil {
			ready <- err
			return
		}
		if filter != nil {
			if err := LoadSeccomp(filter, false); err != nil {
				ready <- err
				return
			}
		}
		// cgroup v1 places threads one by one: this one, and so every
		// command it forks, is charged to the commands' CPU quota and
		// counted against their pids limit; the agent's other threads
		// are not. It joins last, before its first fork: confining
		// itself is the agent's work, and at cpu 0.05 (5 ms a period)
		// the milliseconds it takes left a first command throttled
		// until the next period. The write needs no capability (the
		// opener's credentials count) and neither rule set forbids it.
		for _, fd := range tasks {
			if _, err := unix.Write(fd, []byte(strconv.Itoa(unix.Gettid()))); err != nil {
				ready <- fmt.Errorf("join the commands' cgroup: %w", err)
				return
			}
		}
		ready <- nil
		for req := range sp.reqs {
			pid, err := syscall.ForkExec(req.argv0, req.argv, req.attr)
			req.res <- spawnRes{pid, err}
		}
	}
	go func() {
		runtime.LockOSThread()
		// Never the main thread. The kernel judges a signal to the agent
		// by its thread group leader's credentials, so a leader confined
		// to a phase's domain would take the phase's signals — its
		// commands could kill the agent — and Go never ends the main
		// thread (a locked goroutine exiting there parks it for good, its
		// domain with it). Hold it while the spawner takes another thread.
		if unix.Gettid() == unix.Getpid() {
			taken := make(chan struct{})
			go serve(taken)
			<-taken
			runtime.UnlockOSThread()
			return
		}
		serve(nil)
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return sp, nil
}

// fork runs ForkExec on the spawner's thread.
func (sp *spawner) fork(argv0 string, argv []string, attr *syscall.ProcAttr) (int, error) {
	res := make(chan spawnRes, 1)
	sp.reqs <- spawnReq{argv0, argv, attr, res}
	r := <-res
	return r.pid, r.err
}

// stop ends the spawner. Callers hold the server's policy lock, as every
// fork does.
func (sp *spawner) stop() { close(sp.reqs) }

// confineError is a failure to restrict a command before it starts: the
// agent's fault, not the command's.
type confineError struct{ err error }

func (e *confineError) Error() string { return "confine command: " + e.err.Error() }
func (e *confineError) Unwrap() error { return e.err }
