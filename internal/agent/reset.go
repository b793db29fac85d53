package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// ResetResult is the answer to POST /reset, sent just before the agent
// replaces itself.
type ResetResult struct {
	Killed     int   `json:"killed"`
	DurationMs int64 `json:"duration_ms"`
	// Instance is the answering agent's (see Health): the new one's
	// differs.
	Instance string `json:"instance"`
	// Kept: the same agent serves on (it was unused, see handleReset);
	// otherwise it is re-executing and the next connection reaches a new
	// instance.
	Kept bool `json:"kept,omitempty"`
	// CommandsPlaced: the kept agent took the commands' cgroup tasks files
	// that came with the request (see handleReset); otherwise the edge
	// places them as after a start (PlaceCommands).
	CommandsPlaced bool `json:"commands_placed,omitempty"`
}

// Carried is what an agent hands the agent it re-executes as on a reset:
// the rules in force, and whether its own seccomp filter is loaded
// (filters outlive exec; loading it again would only stack a copy).
type Carried struct {
	Phase    string    `json:"phase,omitempty"`
	Files    FileRules `json:"files"`
	Filtered bool      `json:"filtered"`
}

// ResetIdentity is what a reset may give the sandbox besides a new root: its
// host name and the environment the agent, and so every command, runs
// with. A blank sandbox of the node's pool takes on a tenant sandbox's
// identity this way when it is claimed; a plain reset keeps its own.
type ResetIdentity struct {
	Hostname string   `json:"hostname"`
	Env      []string `json:"env"`
}

// maxIdentityBytes bounds a reset request's body.
const maxIdentityBytes = 1 << 20

// killWait bounds how long a reset waits for the sandbox's processes to
// die after SIGKILL (a process in uninterruptible sleep).
const killWait = 5 * time.Second

// handleReset resets the sandbox in place, as PID 1 of its container. The
// request carries (SCM_RIGHTS) a detached mount of the sandbox's new root
// file system — a fresh overlay the edge built, idmapped like the first —
// and the agent:
//  1. refuses new commands and kills every other process of its PID
//     namespace, waiting until none is left;
//  2. on one locked thread: enters a new IPC namespace (no SysV object or
//     POSIX queue survives), attaches the new root, mounts a fresh /dev
//     (tmpfs, the same device nodes, new devpts, /dev/shm and mqueue),
//     moves /proc, /sys and its other mounts (with their masked and
//     read-only submounts) over, and pivots, dropping the old root;
//  3. answers, then re-executes itself from that thread: a new agent with
//     nothing of the old one's memory (background processes, output
//     buffers, connections), on the same listening socket, in the new IPC
//     namespace, under the same phase rules.
//
// An agent nothing but health checks, resets and cgroup placements ever
// reached (used is false: a blank sandbox of the node's pool, claimed) has
// nothing of a tenant's to drop: it switches roots without a new IPC
// namespace (its own, runc's, was never used by a command) and serves on as
// the same process, answering Kept. Re-executing would cost a Go agent's
// start-up (a claim's largest step on a busy node) for nothing.
//
// A failure before step 2 leaves the sandbox as it was but without its
// processes; a failure in step 2 leaves it unusable: the edge then
// restarts the container.
func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	fds := receivedFDs(r)
	if s.cfg.Reexec == nil || os.Getpid() != 1 {
		closeFDs(fds)
		s.writeError(w, r, errdefs.Invalid("reset in place needs the agent to be PID 1 of a container"))
		return
	}
	if len(fds) < 1 {
		s.writeError(w, r, errdefs.Invalid("reset needs the new root file system as a file descriptor (and the commands' cgroup tasks files after it), got none"))
		return
	}
	// The commands' cgroup tasks files, closed unless a kept agent takes
	// them below.
	tasks := fds[1:]
	if len(tasks) > 0 {
		if err := checkTasksFiles(tasks); err != nil {
			closeFDs(fds)
			s.writeError(w, r, fmt.Errorf("reset: %w", err))
			return
		}
		defer func() { closeFDs(tasks) }()
	}
	root, log, t0 := fds[0], logger(r), time.Now()
	var ident *ResetIdentity
	if r.ContentLength != 0 {
		ident = &ResetIdentity{}
		if err := json.NewDecoder(io.LimitReader(r.Body, maxIdentityBytes)).Decode(ident); err != nil {
			unix.Close(root)
			s.writeError(w, r, errdefs.Invalid("reset: identity: %v", err))
			return
		}
		if err := ident.check(); err != nil {
			unix.Close(root)
			s.writeError(w, r, err)
			return
		}
	}
	s.reaper.hold(true) // waits for a fork in flight
	s.policyMu.Lock()
	if s.spawner != nil {
		s.spawner.stop()
		s.spawner = nil
	}
	carried := Carried{Phase: s.phase, Files: s.files, Filtered: s.cfg.Filtered}
	s.policyMu.Unlock()
	killed, err := killAll(killWait)
	if err != nil {
		unix.Close(root)
		s.reaper.hold(false)
		s.writeError(w, r, fmt.Errorf("reset: %w: %w", err, errdefs.ErrUnavailable))
		return
	}
	keep := !s.used.Load()
	if keep {
		switched := make(chan error, 1)
		go func() {
			// Locked and never unlocked: the thread that switched goes
			// with this goroutine.
			runtime.LockOSThread()
			switched <- switchRoot(root, false, true)
		}()
		err := <-switched
		unix.Close(root)
		if err == nil {
			// What a new agent would open at start: the root every file
			// request resolves beneath is the new one.
			err = s.reopenRoot()
		}
		if err != nil {
			s.writeError(w, r, fmt.Errorf("reset: %w", err))
			return
		}
		if ident != nil {
			if err := ident.apply(); err != nil {
				s.writeError(w, r, fmt.Errorf("reset: %w", err))
				return
			}
		}
		s.reaper.hold(false)
		// And what it would start: the new root's layers' services.
		if _, err := s.Autostart(AutostartDir); err != nil {
			log.WarnContext(r.Context(), "autostart", "err", err)
		}
		res := &ResetResult{Killed: killed, DurationMs: time.Since(t0).Milliseconds(), Instance: instance, Kept: true}
		if len(tasks) > 0 && !s.noConfine {
			// The commands' cgroup, as PlaceCommands would set it, without
			// a round trip of its own; the spawner that joins it is made
			// after the answer, off the create's path.
			s.policyMu.Lock()
			closeFDs(s.cmdTasks)
			s.cmdTasks, tasks = tasks, nil
			s.policyMu.Unlock()
			res.CommandsPlaced = true
		}
		log.InfoContext(r.Context(), "reset; the unused agent serves on", "killed", killed, "duration", time.Since(t0))
		writeJSON(w, http.StatusOK, res)
		if res.CommandsPlaced {
			_ = http.NewResponseController(w).Flush()
			go s.prepareSpawner(log)
		}
		return
	}
	state, err := carryState(carried)
	if err != nil {
		unix.Close(root)
		s.reaper.hold(false)
		s.writeError(w, r, fmt.Errorf("reset: %w", err))
		return
	}
	lfd, err := s.inheritableListener()
	if err != nil {
		unix.Close(root)
		unix.Close(state)
		s.reaper.hold(false)
		s.writeError(w, r, fmt.Errorf("reset: %w", err))
		return
	}
	switched := make(chan error, 1)
	proceed := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: this thread becomes the new agent
		err := switchRoot(root, true, false)
		unix.Close(root)
		switched <- err
		if err != nil {
			return
		}
		<-proceed
		err = s.cfg.Reexec(lfd, state)
		log.ErrorContext(r.Context(), "reset: re-exec failed; the sandbox cannot go on", "err", err)
		os.Exit(1)
	}()
	if err := <-switched; err != nil {
		// New commands stay refused: only a new container repairs this.
		s.writeError(w, r, fmt.Errorf("reset: %w", err))
		return
	}
	if ident != nil {
		// Before the re-exec, which takes the environment along; the host
		// name is the UTS namespace's, which the agent owns.
		if err := ident.apply(); err != nil {
			s.writeError(w, r, fmt.Errorf("reset: %w", err))
			return
		}
	}
	log.InfoContext(r.Context(), "reset", "killed", killed, "duration", time.Since(t0))
	// A complete response (a length, not chunks) before exec cuts the
	// connection.
	body, _ := json.Marshal(&ResetResult{Killed: killed, DurationMs: time.Since(t0).Milliseconds(), Instance: instance})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	_ = http.NewResponseController(w).Flush()
	close(proceed)
	select {} // the re-exec ends this process image
}

func (id *ResetIdentity) check() error {
	if id.Hostname == "" || len(id.Hostname) > 64 {
		return errdefs.Invalid("reset: identity: a host name of 1 to 64 bytes, got %q", id.Hostname)
	}
	for _, kv := range id.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			return errdefs.Invalid("reset: identity: bad environment entry %q", kv)
		}
	}
	return nil
}

func (id *ResetIdentity) apply() error {
	if err := unix.Sethostname([]byte(id.Hostname)); err != nil {
		return fmt.Errorf("set host name: %w", err)
	}
	os.Clearenv()
	for _, kv := range id.Env {
		k, v, _ := strings.Cut(kv, "=")
		if err := os.Setenv(k, v); err != nil {
			return fmt.Errorf("environment: %w", err)
		}
	}
	return nil
}

// killAll kills every process of the PID namespace but the caller (PID 1:
// kill(-1) spares it) and waits until they are gone, reaped by the
// reaper. It returns how many there were at most.
func killAll(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	most := 0
	for {
		n, err := otherProcesses()
		if err != nil {
			return most, err
		}
		if n == 0 {
			return most, nil
		}
		most = max(most, n)
		if err := unix.Kill(-1, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			return most, fmt.Errorf("kill: %w", err)
		}
		if time.Now().After(deadline) {
			return most, fmt.Errorf("%d processes still alive %s after SIGKILL", n, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// otherProcesses counts the processes /proc shows besides this one.
func otherProcesses() (int, error) {
	f, err := os.Open("/proc")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	self, n := os.Getpid(), 0
	for _, name := range names {
		if pid, err := strconv.Atoi(name); err == nil && pid != self {
			n++
		}
	}
	return n, nil
}

// carryState writes c into a memory file the next agent inherits.
func carryState(c Carried) (int, error) {
	b, err := json.Marshal(&c)
	if err != nil {
		return -1, err
	}
	fd, err := unix.MemfdCreate("dsec-agent-state", 0) // inherited across exec
	if err != nil {
		return -1, fmt.Errorf("state: %w", err)
	}
	if _, err := unix.Pwrite(fd, b, 0); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("state: %w", err)
	}
	return fd, nil
}

// ReadCarried reads and closes the state an agent inherited on a reset.
func ReadCarried(fd int) (*Carried, error) {
	f := os.NewFile(uintptr(fd), "state")
	defer f.Close()
	var c Carried
	if err := json.NewDecoder(f).Decode(&c); err != nil {
		return nil, fmt.Errorf("read carried state: %w", err)
	}
	return &c, nil
}

// inheritableListener returns a descriptor of the listening socket that
// survives exec.
func (s *Server) inheritableListener() (int, error) {
	s.lmu.Lock()
	l := s.listener
	s.lmu.Unlock()
	ul, ok := l.(*net.UnixListener)
	if !ok {
		return -1, errors.New("the agent does not listen on a unix socket")
	}
	rc, err := ul.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	cerr := rc.Control(func(l uintptr) { fd, err = unix.Dup(int(l)) }) // dup(2): not close-on-exec
	if cerr != nil {
		return -1, cerr
	}
	return fd, err
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// reopenRoot points the agent's root (beneath which every file request
// resolves) at the current "/": after a root switch that kept the
// process, the descriptor opened at start still holds the old one.
func (s *Server) reopenRoot() error {
	root, err := unix.Open(s.cfg.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open root %s: %w", s.cfg.Root, err)
	}
	old := s.root
	s.root = root
	unix.Close(old)
	return nil
}
