package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
)

// drainGrace bounds how long output is waited for after a command's
// leader has exited: a background child still holding the pipe must not
// hold the request. It never cuts what the leader wrote: that is in the
// pipe when it exits, and is read whatever the time (see pump).
const drainGrace = 75 * time.Millisecond

// setupProcess makes the calling process fit to be the agent.
func setupProcess() error {
	// Same uid but no CAP_SYS_PTRACE: sandboxed processes can then neither
	// ptrace the agent nor open /proc/<agent>/fd/*.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("set non-dumpable: %w", err)
	}
	// Outside a PID namespace orphans would go to the real init; adopt
	// them so they are still reaped by us.
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set child subreaper: %w", err)
		}
	}
	// A write to a closed stderr must not kill PID 1. Catching SIGPIPE,
	// unlike ignoring it, leaves children with the default action.
	signal.Notify(make(chan os.Signal, 1), unix.SIGPIPE)
	return nil
}

// startError is a command that could not be started: not found, not
// executable, a missing cwd. It is reported the way a shell reports it, as
// exit code and stderr, not as an agent failure.
type startError struct {
	code int // 127: not found; 126: anything else
	msg  string
}

func (e *startError) Error() string { return e.msg }

func execError(path string, err error) *startError {
	code := 126
	if errors.Is(err, unix.ENOENT) {
		code = 127
	}
	return &startError{code: code, msg: fmt.Sprintf("%s: %v", path, err)}
}

// result is the ExecResult of a command that never started.
func (e *startError) result() (api.ExecResult, []byte) {
	return api.ExecResult{ExitCode: e.code}, []byte("dsec-agent: " + e.msg + "\n")
}

// execSpec is a validated command, ready to start.
type execSpec struct {
	argv0     string // resolved path of the executable
	argv      []string
	env       []string
	dir       string
	stdin     []byte // nil: /dev/null
	timeout   time.Duration
	maxOutput int
	fail      *startError  // set when it cannot start: report it, do not fork
	tag       string       // of a background process
	tty       *api.TTYSize // run on a pseudo-terminal of this size
	keepStdin bool         // the caller writes stdin (after start) and closes it
}

// stdio are the pipes of a command: the child's ends and ours.
type stdio struct {
	// child are the descriptors the child gets as stdin, stdout and
	// stderr. They are plain descriptors, never in Go's poller: the child
	// needs them blocking, and registering them only to take them out
	// again cost the agent a dozen system calls per command.
	child [3]int
	// owned are the child's ends the agent closes once the child has them
	// (a shared /dev/null is not among them).
	owned []int
	// childFile is a terminal's slave side (all of child), or nil.
	childFile      *os.File
	stdin          *os.File // write end of the child's stdin, or nil
	stdout, stderr *os.File // read ends; stderr is nil on a terminal
	pty            *os.File // a terminal's master side (also stdout), or nil
}

func openStdio(withStdin bool) (_ *stdio, err error) {
	s := &stdio{}
	defer func() {
		if err != nil {
			s.closeChild()
			s.closeParent()
		}
	}()
	if withStdin {
		if s.child[0], s.stdin, err = s.pipe(false); err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
	} else if s.child[0], err = devNull(); err != nil {
		return nil, fmt.Errorf("open stdin: %w", err)
	}
	if s.child[1], s.stdout, err = s.pipe(true); err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	if s.child[2], s.stderr, err = s.pipe(true); err != nil {
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}
	return s, nil
}

// pipe makes a pipe whose child end is a plain blocking descriptor, kept
// in owned, and whose end for the agent (the read end if parentReads) is
// non-blocking, in Go's poller, so that read deadlines work on it.
func (s *stdio) pipe(parentReads bool) (int, *os.File, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return -1, nil, err
	}
	child, ours := p[0], p[1]
	if parentReads {
		child, ours = p[1], p[0]
	}
	if err := unix.SetNonblock(ours, true); err != nil {
		unix.Close(child)
		unix.Close(ours)
		return -1, nil, err
	}
	s.owned = append(s.owned, child)
	return child, os.NewFile(uintptr(ours), "|"), nil
}

// devNull is a descriptor of /dev/null every command without stdin
// shares, opened once: reading it gives end of file whatever a command
// does to it.
var devNull = sync.OnceValues(func() (int, error) {
	return unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
})

func (s *stdio) closeChild() {
	for _, fd := range s.owned {
		unix.Close(fd)
	}
	s.owned = nil
	if s.childFile != nil {
		s.childFile.Close()
	}
}

func (s *stdio) closeParent() {
	for _, f := range []*os.File{s.stdin, s.stdout, s.stderr, s.pty} {
		if f != nil {
			f.Close()
		}
	}
}

// command is a started process group whose output is being pumped into
// two writers.
type command struct {
	child   *child
	io      *stdio
	started time.Time
	exited  time.Time // set by wait
	pumps   sync.WaitGroup
	// read counts the bytes pumped from stdout and stderr; owed is, from
	// the leader's exit on, a bound on what the pipe held then (see drain).
	read, owed [2]atomic.Int64
}

// start forks the command in its own process group and pumps its stdout
// and stderr into the writers until wait has drained them. A command that
// cannot start returns a *startError.
func (s *Server) start(spec *execSpec, stdout, stderr io.Writer) (*command, error) {
	if spec.fail != nil {
		return nil, spec.fail
	}
	var pipes *stdio
	var err error
	if spec.tty != nil {
		pipes, err = openTerminal(spec.tty)
	} else {
		pipes, err = openStdio(spec.stdin != nil || spec.keepStdin)
	}
	if err != nil {
		return nil, err
	}
	attr := &syscall.ProcAttr{
		Dir: spec.dir,
		Env: spec.env,
		// The child's ends are blocking; ours are in the poller so that
		// read deadlines work on them.
		Files: []uintptr{uintptr(pipes.child[0]), uintptr(pipes.child[1]), uintptr(pipes.child[2])},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	if pipes.pty != nil {
		// A terminal's command leads a new session (and so its own
		// process group) whose controlling terminal is its stdin.
		attr.Sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	started := time.Now()
	ch, err := s.reaper.start(spec.argv0, spec.argv, attr, s.forker())
	pipes.closeChild()
	if err != nil {
		pipes.closeParent()
		return nil, err
	}
	if s.protected {
		// The agent is shielded from the OOM killer; its commands are not.
		_ = os.WriteFile("/proc/"+strconv.Itoa(ch.pid)+"/oom_score_adj", []byte("0"), 0)
	}
	c := &command{child: ch, io: pipes, started: started}
	c.pumps.Add(1)
	go c.pump(0, pipes.stdout, stdout)
	if pipes.stderr != nil {
		c.pumps.Add(1)
		go c.pump(1, pipes.stderr, stderr)
	}
	switch {
	case spec.keepStdin:
		// The caller keeps the write end (pipes.stdin or pipes.pty).
	case pipes.pty != nil && spec.stdin != nil:
		// Typed into the terminal; the terminal stays open.
		go func() { _, _ = pipes.pty.Write(spec.stdin) }()
	case pipes.stdin != nil:
		go func() {
			// EPIPE (the child did not read it all) or closed by drain.
			_, _ = pipes.stdin.Write(spec.stdin)
			pipes.stdin.Close()
		}()
	}
	return c, nil
}

func (c *command) pump(i int, r *os.File, w io.Writer) {
	defer c.pumps.Done()
	buf := make([]byte, pumpBuf)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n]) // our writers do not fail
			c.read[i].Add(int64(n))
		}
		if err != nil {
			// drain's deadline passed. What the leader wrote before it
			// exited may still wait in the pipe (a starved agent reads
			// late): read on while the pipe holds data and less than owed
			// was read. A pipe empty at the deadline, or a lingering
			// child's endless writes past owed, end it.
			if errors.Is(err, os.ErrDeadlineExceeded) && c.read[i].Load() < c.owed[i].Load() && pending(r) > 0 {
				_ = r.SetReadDeadline(time.Now().Add(drainGrace))
				continue
			}
			return
		}
	}
}

// pumpBuf is the most one read of a pump takes from a pipe.
const pumpBuf = 32 << 10

// pending is how many bytes wait in the pipe r (0 if unknown).
func pending(r *os.File) int {
	rc, err := r.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	// TIOCINQ is FIONREAD, which pipes answer too.
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
	return n
}

// wait waits for the leader to exit, killing the group on timeout (if
// nonzero) or when ctx ends, then drains the output. It reports whether the
// timeout fired.
func (c *command) wait(ctx context.Context, timeout time.Duration) (timedOut bool) {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-c.child.done:
	case <-expired:
		select {
		case <-c.child.done: // exited as the timer fired
		default:
			timedOut = true
			c.child.signalGroup(unix.SIGKILL)
			<-c.child.done
		}
	case <-ctx.Done():
		c.child.signalGroup(unix.SIGKILL)
		<-c.child.done
	}
	c.exited = time.Now()
	c.drain()
	return timedOut
}

// drain reads what is left in the pipes and closes them: all that the
// leader wrote, and what lingering children write within drainGrace. It
// does not kill what still holds them.
//
// owed bounds what the pipe held at the leader's exit from above: bytes
// waiting, plus bytes read so far, plus one read a pump may have taken
// from the pipe and not counted yet.
func (c *command) drain() {
	deadline := time.Now().Add(drainGrace)
	for i, f := range []*os.File{c.io.stdout, c.io.stderr} {
		if f == nil {
			continue
		}
		c.owed[i].Store(int64(pending(f)) + c.read[i].Load() + pumpBuf)
		_ = f.SetReadDeadline(deadline)
	}
	c.pumps.Wait()
	c.io.closeParent() // also ends a stdin write nobody reads
}

// result is the exit of a waited-for command, without output.
func (c *command) result(timedOut bool) api.ExecResult {
	r := api.ExecResult{TimedOut: timedOut, DurationMs: c.exited.Sub(c.started).Milliseconds()}
	switch ws := c.child.status; {
	case ws.Exited():
		r.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		r.ExitCode = 128 + int(ws.Signal())
		r.Signal = unix.SignalName(ws.Signal())
	}
	return r
}

// parseSignal accepts a signal name with or without its SIG prefix.
func parseSignal(name string) (unix.Signal, bool) {
	switch strings.TrimPrefix(strings.ToUpper(name), "SIG") {
	case "TERM":
		return unix.SIGTERM, true
	case "KILL":
		return unix.SIGKILL, true
	case "INT":
		return unix.SIGINT, true
	case "HUP":
		return unix.SIGHUP, true
	case "QUIT":
		return unix.SIGQUIT, true
	case "USR1":
		return unix.SIGUSR1, true
	case "USR2":
		return unix.SIGUSR2, true
	}
	return 0, false
}
