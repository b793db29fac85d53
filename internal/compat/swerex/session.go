package swerex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
)

// Markers of SWE-ReX's BashSession.
const (
	ps1            = "SHELLPS1PREFIX"
	uniqueString   = "UNIQUESTRING29234"
	exitCodePrefix = "EXITCODESTART"
	exitCodeSuffix = "EXITCODEEND"
	// readyMarker is printed by the session's launcher once the terminal
	// no longer echoes, before the shell starts.
	readyMarker = "DSEC_SWEREX_READY"
	// spawnTimeout bounds starting the terminal, beyond the client's
	// startup_timeout (which covers what SWE-ReX's covers: the startup
	// files and the first prompt).
	spawnTimeout = 15 * time.Second
	// markerTimeout bounds the wait for the exit code and the prompt after
	// it (SWE-ReX: 1 s and 0.1 s on a local pty; a WebSocket hop is given
	// more).
	markerTimeout = 10 * time.Second
	maxSessionBuf = 64 << 20
)

// launcher turns off the terminal's echo (pexpect's echo=False), says so,
// and runs the shell: bash from PATH as SWE-ReX's /usr/bin/env bash, or,
// in an image without bash, its POSIX sh with the same protocol.
func launcher(shell string) string {
	return "stty -echo 2>/dev/null; echo " + readyMarker + "; exec " + shell
}

// shells are the session's shells, in order of preference.
var shells = []string{"bash", "sh"}

func shellArgv(shell string, args ...string) []string {
	if shell == "bash" {
		return append([]string{"/usr/bin/env", "bash"}, args...)
	}
	return append([]string{"/bin/sh"}, args...)
}

var ansiEscape = regexp.MustCompile("\x1b[@-_][0-?]*[ -/]*[@-~]")

// stripControl is SWE-ReX's _strip_control_chars, on decoded text.
func stripControl(b []byte) string {
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	return strings.ReplaceAll(ansiEscape.ReplaceAllString(s, ""), "\r\n", "\n")
}

// session is one shell on a pseudo-terminal, read into a buffer that
// expect searches as pexpect does.
type session struct {
	term  io.ReadWriteCloser
	shell string     // "bash" or "sh"
	run   sync.Mutex // one action at a time, as pexpect is blocking
	files int        // commands sent through a file (under run)

	mu      sync.Mutex
	buf     []byte
	changed chan struct{} // closed when buf grows or the reader ends
	err     error         // why the reader ended
}

func newSession(term io.ReadWriteCloser, shell string) *session {
	s := &session{term: term, shell: shell, changed: make(chan struct{})}
	go s.read()
	return s
}

func (s *session) read() {
	p := make([]byte, 32<<10)
	for {
		n, err := s.term.Read(p)
		s.mu.Lock()
		if n > 0 {
			s.buf = append(s.buf, p[:n]...)
			if len(s.buf) > maxSessionBuf { // nobody reads it: keep the tail
				s.buf = append([]byte(nil), s.buf[len(s.buf)-maxSessionBuf/2:]...)
			}
		}
		if err != nil {
			s.err = err
		}
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (s *session) close() { _ = s.term.Close() }

// ended reports whether the shell's terminal has closed.
func (s *session) ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

func (s *session) send(text string) error {
	if _, err := s.term.Write([]byte(text)); err != nil {
		return pyErr(excOS, "the session's shell is gone: %v", err)
	}
	return nil
}

// errExpectTimeout is pexpect's TIMEOUT.
var errExpectTimeout = errors.New("timeout")

// expect waits for the earliest match of any pattern in what the shell
// wrote and has not been consumed, and consumes it: it returns the text
// before the match and which pattern matched. timeout <= 0 waits until ctx
// ends.
func (s *session) expect(ctx context.Context, patterns []*regexp.Regexp, timeout time.Duration) (before []byte, idx int, err error) {
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	for {
		s.mu.Lock()
		best, bestEnd := -1, 0
		for i, re := range patterns {
			if loc := re.FindIndex(s.buf); loc != nil && (best < 0 || loc[0] < best) {
				best, bestEnd, idx = loc[0], loc[1], i
			}
		}
		if best >= 0 {
			before = append([]byte(nil), s.buf[:best]...)
			s.buf = append(s.buf[:0:0], s.buf[bestEnd:]...)
			s.mu.Unlock()
			return before, idx, nil
		}
		changed, rerr := s.changed, s.err
		s.mu.Unlock()
		if rerr != nil {
			return nil, -1, pyErr(excEOF, "End Of File (EOF). The session's shell exited: %v", rerr)
		}
		select {
		case <-changed:
		case <-deadline:
			return nil, -1, errExpectTimeout
		case <-ctx.Done():
			return nil, -1, ctx.Err()
		}
	}
}

// drain returns what the shell writes in the next d (SWE-ReX's
// _eat_following_output).
func (s *session) drain(ctx context.Context, d time.Duration) []byte {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.buf
	s.buf = nil
	return out
}

func literal(s string) *regexp.Regexp { return regexp.MustCompile(regexp.QuoteMeta(s)) }

var ps1Re, uniqueRe, exitSuffixRe = literal(ps1), literal(uniqueString), literal(exitCodeSuffix)

// expectList compiles an action's expect strings (regular expressions, as
// pexpect takes them) followed by PS1.
func expectList(expect []string) ([]*regexp.Regexp, []string, error) {
	res := make([]*regexp.Regexp, 0, len(expect)+1)
	for _, e := range expect {
		re, err := regexp.Compile(e)
		if err != nil {
			return nil, nil, pyErr("re.error", "%v", err)
		}
		res = append(res, re)
	}
	return append(res, ps1Re), append(append([]string(nil), expect...), ps1), nil
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// CreateBashSessionRequest is SWE-ReX's.
type createSessionRequest struct {
	StartupSource  []string `json:"startup_source"`
	Session        *string  `json:"session"`
	SessionType    *string  `json:"session_type"`
	StartupTimeout *float64 `json:"startup_timeout"`
}

func checkSessionType(t *string) error {
	if t != nil && *t != "bash" {
		return validationErrors{{Type: "union_tag_invalid", Loc: []string{"body"},
			Msg: fmt.Sprintf("Input tag '%s' found using 'session_type' does not match any of the expected tags: 'bash'", *t), Input: *t}}
	}
	return nil
}

func (h *Handler) createSession(ctx context.Context, r *http.Request, rt *runtime, box Box) (any, error) {
	var req createSessionRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	if err := checkSessionType(req.SessionType); err != nil {
		return nil, err
	}
	name := "default"
	if req.Session != nil {
		name = *req.Session
	}
	timeout := 1.0
	if req.StartupTimeout != nil {
		timeout = *req.StartupTimeout
	}
	rt.mu.Lock()
	if _, ok := rt.sessions[name]; ok {
		rt.mu.Unlock()
		return nil, pyErr(excSessionExists, "session %s already exists", name)
	}
	rt.sessions[name] = nil // reserved while it starts
	rt.mu.Unlock()
	s, out, err := h.startSession(ctx, box, req.StartupSource, seconds(timeout))
	rt.mu.Lock()
	if err != nil {
		delete(rt.sessions, name)
	} else {
		rt.sessions[name] = s
	}
	rt.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return map[string]any{"output": out, "session_type": "bash"}, nil
}

// startSession starts a shell as BashSession.start does: PS1, PS2 and PS0
// set, startup files sourced, then the prompt awaited.
func (h *Handler) startSession(ctx context.Context, box Box, startup []string, timeout time.Duration) (*session, string, error) {
	var s *session
	for i, sh := range shells {
		term, err := box.Terminal(ctx, shellArgv(sh, "-c", launcher(sh)),
			map[string]string{"PS1": "", "PS2": "", "PS0": "", "TERM": "dumb"})
		if err != nil {
			return nil, "", err
		}
		s = newSession(term, sh)
		_, _, err = s.expect(ctx, []*regexp.Regexp{literal(readyMarker)}, spawnTimeout)
		if err == nil {
			break
		}
		s.close()
		var pe *pyError
		if errors.As(err, &pe) && pe.class == excEOF && i+1 < len(shells) {
			continue // no such shell in the image: the next one
		}
		if errors.Is(err, errExpectTimeout) {
			err = pyErr(excPexpectTimeout, "Timeout exceeded while starting the session's shell.")
		}
		return nil, "", err
	}
	fail := func(err error) (*session, string, error) {
		s.close()
		return nil, "", err
	}
	// SWE-ReX sends one line: sources, sleep 0.3, exports. The exports go
	// on a line of their own here, because a POSIX sh abandons the rest of
	// a line when a sourced file is missing; the prompt of the first line
	// is the empty PS1 the shell started with, so it shows nowhere.
	var line string
	if len(startup) > 0 {
		cmds := make([]string, 0, len(startup)+1)
		for _, p := range startup {
			cmds = append(cmds, "source "+p)
		}
		line = strings.Join(append(cmds, "sleep 0.3"), " ; ") + "\n"
	}
	line += "export PS1='" + ps1 + "' ; export PS2='' ; export PS0=''\n"
	if err := s.send(line); err != nil {
		return fail(err)
	}
	before, _, err := s.expect(ctx, []*regexp.Regexp{ps1Re}, timeout)
	if err != nil {
		if errors.Is(err, errExpectTimeout) {
			err = pyErr(excPexpectTimeout, "Timeout exceeded.")
		}
		return fail(err)
	}
	out := strings.TrimPrefix(stripControl(before), "\n")
	return s, out, nil
}

// action is BashAction or BashInterruptAction, told apart by action_type.
type action struct {
	ActionType           *string  `json:"action_type"`
	Command              *string  `json:"command"`
	Session              *string  `json:"session"`
	Timeout              *float64 `json:"timeout"`
	IsInteractiveCommand bool     `json:"is_interactive_command"`
	IsInteractiveQuit    bool     `json:"is_interactive_quit"`
	Check                *string  `json:"check"`
	ErrorMsg             string   `json:"error_msg"`
	Expect               []string `json:"expect"`
	NRetry               *int     `json:"n_retry"`
}

type observation struct {
	Output        string `json:"output"`
	ExitCode      *int   `json:"exit_code"`
	FailureReason string `json:"failure_reason"`
	ExpectString  string `json:"expect_string"`
	SessionType   string `json:"session_type"`
}

func (h *Handler) runInSession(ctx context.Context, r *http.Request, rt *runtime, box Box) (any, error) {
	var a action
	if err := decodeBody(r, &a); err != nil {
		return nil, err
	}
	if a.ActionType == nil {
		return nil, validationErrors{{Type: "union_tag_not_found", Loc: []string{"body"},
			Msg: "Unable to extract tag using discriminator 'action_type'", Input: nil}}
	}
	name := "default"
	if a.Session != nil {
		name = *a.Session
	}
	switch *a.ActionType {
	case "bash":
		if a.Command == nil {
			return nil, invalid("missing", "Field required", nil, "bash", "command")
		}
		if a.Check == nil {
			a.Check = ptr("raise")
		}
		switch *a.Check {
		case "raise", "silent", "ignore":
		default:
			return nil, invalid("literal_error", "Input should be 'silent', 'raise' or 'ignore'", *a.Check, "bash", "check")
		}
	case "bash_interrupt":
		if a.Timeout == nil {
			a.Timeout = ptr(0.2)
		}
		if a.NRetry == nil {
			a.NRetry = ptr(3)
		}
		if *a.NRetry < 0 || *a.NRetry > 100 {
			return nil, invalid("value_error", "n_retry must be between 0 and 100", *a.NRetry, "bash_interrupt", "n_retry")
		}
	default:
		return nil, validationErrors{{Type: "union_tag_invalid", Loc: []string{"body"},
			Msg:   fmt.Sprintf("Input tag '%s' found using 'action_type' does not match any of the expected tags: 'bash', 'bash_interrupt'", *a.ActionType),
			Input: *a.ActionType}}
	}
	if a.Timeout != nil && (*a.Timeout < 0 || *a.Timeout > 86400) {
		return nil, invalid("value_error", "timeout must be between 0 and 86400 seconds", *a.Timeout, "timeout")
	}
	rt.mu.Lock()
	s, ok := rt.sessions[name]
	rt.mu.Unlock()
	if !ok {
		return nil, pyErr(excNoSession, "session %s does not exist", pyRepr(name))
	}
	if s == nil {
		return nil, pyErr(excNotInitialized, "shell not initialized")
	}
	s.run.Lock()
	defer s.run.Unlock()
	if *a.ActionType == "bash_interrupt" {
		return s.interrupt(ctx, &a)
	}
	if a.IsInteractiveCommand || a.IsInteractiveQuit {
		return s.runInteractive(ctx, &a)
	}
	obs, err := s.runNormal(ctx, box, &a)
	if err != nil {
		return nil, err
	}
	if *a.Check == "raise" && (obs.ExitCode == nil || *obs.ExitCode != 0) {
		code := "None"
		if obs.ExitCode != nil {
			code = fmt.Sprint(*obs.ExitCode)
		}
		msg := fmt.Sprintf("Command %s failed with exit code %s. Here is the output:\n%s", pyRepr(*a.Command), code, pyRepr(obs.Output))
		if a.ErrorMsg != "" {
			msg = a.ErrorMsg + ": " + msg
		}
		return nil, &pyError{class: excNonZero, msg: msg}
	}
	return obs, nil
}

// wrap makes a command one shell command, so that the shell prints one
// prompt for it however many lines and heredocs it has (SWE-ReX joins
// bashlex's top-level commands with " ; " for the same end).
func wrap(cmd string) string {
	blank := true
	for l := range strings.SplitSeq(strings.TrimSpace(cmd), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			blank = false
			break
		}
	}
	if blank {
		return ""
	}
	return "{ " + cmd + "\n}"
}

// runNormal is BashSession._run_normal: syntax check, run, wait for the
// prompt, read the exit code.
func (s *session) runNormal(ctx context.Context, box Box, a *action) (*observation, error) {
	if err := checkSyntax(ctx, box, s.shell, *a.Command); err != nil {
		return nil, err
	}
	cmd := wrap(*a.Command)
	patterns, names, err := expectList(a.Expect)
	if err != nil {
		return nil, err
	}
	line, err := s.viaFile(ctx, box, cmd)
	if err != nil {
		return nil, err
	}
	if err := s.send(line + "\n"); err != nil {
		return nil, err
	}
	var timeout time.Duration
	if a.Timeout != nil {
		timeout = max(seconds(*a.Timeout), time.Millisecond)
	}
	before, idx, err := s.expect(ctx, patterns, timeout)
	if errors.Is(err, errExpectTimeout) {
		t := "None"
		if a.Timeout != nil {
			t = pyFloat(*a.Timeout)
		}
		return nil, pyErr(excTimeout, "timeout after %s seconds while running command %s", t, pyRepr(cmd))
	}
	if err != nil {
		return nil, err
	}
	obs := &observation{Output: stripControl(before), ExpectString: names[idx], SessionType: "bash"}
	if *a.Check == "ignore" {
		return obs, nil
	}
	code, rest, err := s.exitCode(ctx)
	if err != nil {
		if *a.Check == "raise" {
			return nil, err
		}
		return obs, nil // silent: exit_code null
	}
	obs.Output += rest
	obs.Output = strings.ReplaceAll(strings.ReplaceAll(obs.Output, uniqueString, ""), ps1, "")
	obs.ExitCode = &code
	return obs, nil
}

// maxTypedLine is the longest line typed into the terminal: a terminal
// in canonical mode (a POSIX sh's, where readline does not read) cuts
// lines at 4095 bytes.
const maxTypedLine = 1024

// viaFile returns the line that runs cmd in the session: cmd itself, or,
// when a line of it is too long to type, "." of a file that holds it
// (sourced, so cd and export persist; the file removes itself first).
func (s *session) viaFile(ctx context.Context, box Box, cmd string) (string, error) {
	long := false
	for l := range strings.SplitSeq(cmd, "\n") {
		if len(l) > maxTypedLine {
			long = true
			break
		}
	}
	if !long {
		return cmd, nil
	}
	s.files++
	p := fmt.Sprintf("/tmp/.dsec-swerex-%d-%d", time.Now().UnixNano(), s.files)
	if err := box.WriteFile(ctx, p, []byte("rm -f "+p+"\n"+cmd+"\n")); err != nil {
		return "", err
	}
	return ". " + p, nil
}

var exitCodeRe = regexp.MustCompile(exitCodePrefix + "([0-9]+)")

// exitCode asks the shell for $? as SWE-ReX does, and returns it with the
// output that came before it.
func (s *session) exitCode(ctx context.Context) (int, string, error) {
	if err := s.send("\necho " + exitCodePrefix + "$?" + exitCodeSuffix + "\n"); err != nil {
		return 0, "", err
	}
	raw, _, err := s.expect(ctx, []*regexp.Regexp{exitSuffixRe}, markerTimeout)
	if errors.Is(err, errExpectTimeout) {
		return 0, "", pyErr(excNoExitCode, "timeout while getting exit code")
	}
	if err != nil {
		return 0, "", err
	}
	text := stripControl(raw)
	m := exitCodeRe.FindAllStringSubmatch(text, -1)
	if len(m) != 1 {
		return 0, "", pyErr(excNoExitCode, "failed to parse exit code from output %s", pyRepr(text))
	}
	var code int
	fmt.Sscan(m[0][1], &code)
	if _, _, err := s.expect(ctx, []*regexp.Regexp{ps1Re}, markerTimeout); err != nil {
		if errors.Is(err, errExpectTimeout) {
			err = pyErr(excTimeout, "Timeout while getting PS1 after exit code extraction")
		}
		return 0, "", err
	}
	before, _, _ := strings.Cut(text, exitCodePrefix)
	return code, before, nil
}

// runInteractive is BashSession._run_interactive: no syntax check, no
// exit code.
func (s *session) runInteractive(ctx context.Context, a *action) (*observation, error) {
	patterns, names, err := expectList(a.Expect)
	if err != nil {
		return nil, err
	}
	if err := s.send(*a.Command + "\n"); err != nil {
		return nil, err
	}
	var timeout time.Duration
	if a.Timeout != nil {
		timeout = max(seconds(*a.Timeout), time.Millisecond)
	}
	before, idx, err := s.expect(ctx, patterns, timeout)
	if errors.Is(err, errExpectTimeout) {
		t := "None"
		if a.Timeout != nil {
			t = pyFloat(*a.Timeout)
		}
		return nil, pyErr(excTimeout, "timeout after %s seconds while running command %s", t, pyRepr(*a.Command))
	}
	if err != nil {
		return nil, err
	}
	out := stripControl(before)
	if a.IsInteractiveQuit {
		if err := s.send("stty -echo; echo '" + uniqueString + "'\n"); err != nil {
			return nil, err
		}
		for _, re := range []*regexp.Regexp{uniqueRe, ps1Re} {
			if _, _, err := s.expect(ctx, []*regexp.Regexp{re}, markerTimeout); err != nil {
				if errors.Is(err, errExpectTimeout) {
					err = pyErr(excPexpectTimeout, "Timeout exceeded.")
				}
				return nil, err
			}
		}
	} else {
		out = strings.TrimSpace(strings.TrimPrefix(strings.TrimLeft(out, " \t\r\n"), *a.Command))
	}
	zero := 0
	return &observation{Output: out, ExitCode: &zero, ExpectString: names[idx], SessionType: "bash"}, nil
}

// interrupt is BashSession.interrupt: Ctrl-C up to n_retry times, then
// Ctrl-Z and kill -9 %1.
func (s *session) interrupt(ctx context.Context, a *action) (*observation, error) {
	patterns, names, err := expectList(a.Expect)
	if err != nil {
		return nil, err
	}
	timeout := max(seconds(*a.Timeout), time.Millisecond)
	zero := 0
	for range *a.NRetry {
		if err := s.send("\x03"); err != nil {
			return nil, err
		}
		before, idx, err := s.expect(ctx, patterns, timeout)
		if errors.Is(err, errExpectTimeout) {
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		out := stripControl(before) + stripControl(s.drain(ctx, 500*time.Millisecond))
		return &observation{Output: strings.TrimSpace(out), ExitCode: &zero, ExpectString: names[idx], SessionType: "bash"}, nil
	}
	var out bytes.Buffer
	for _, keys := range []string{"\x1a", "kill -9 %1\n"} {
		if err := s.send(keys); err != nil {
			return nil, err
		}
		before, idx, err := s.expect(ctx, patterns, timeout)
		if errors.Is(err, errExpectTimeout) {
			return nil, pyErr(excPexpectTimeout, "Failed to interrupt session")
		}
		if err != nil {
			return nil, err
		}
		out.Write(before)
		if keys != "\x1a" {
			out.Write(s.drain(ctx, 500*time.Millisecond))
			return &observation{Output: strings.TrimSpace(stripControl(out.Bytes())), ExitCode: &zero,
				ExpectString: names[idx], SessionType: "bash"}, nil
		}
	}
	return nil, pyErr(excPexpectTimeout, "Failed to interrupt session")
}

// checkSyntax is SWE-ReX's _check_bash_command: bash -n on the command
// in the sandbox (sh -n in a session of sh).
func checkSyntax(ctx context.Context, box Box, shell, command string) error {
	res, err := box.Exec(ctx, &api.ExecRequest{Cmd: shellArgv(shell, "-n"), Stdin: command + "\n",
		TimeoutMs: 30_000})
	if err != nil {
		return err
	}
	if res.ExitCode == 0 && res.Signal == "" {
		return nil
	}
	stdout, stderr := text(res.Stdout, res.Encoding), text(res.Stderr, res.Encoding)
	msg := fmt.Sprintf("Error (exit code %d) while checking bash command \n%s\n---- Stderr ----\n%s\n---- Stdout ----\n%s",
		res.ExitCode, pyRepr(command), stderr, stdout)
	return &pyError{class: excSyntax, msg: msg, extra: map[string]any{"bash_stdout": stdout, "bash_stderr": stderr}}
}

type closeSessionRequest struct {
	Session     *string `json:"session"`
	SessionType *string `json:"session_type"`
}

func (h *Handler) closeSession(ctx context.Context, r *http.Request, rt *runtime, box Box) (any, error) {
	var req closeSessionRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	if err := checkSessionType(req.SessionType); err != nil {
		return nil, err
	}
	name := "default"
	if req.Session != nil {
		name = *req.Session
	}
	rt.mu.Lock()
	s, ok := rt.sessions[name]
	if ok && s != nil {
		delete(rt.sessions, name)
	}
	rt.mu.Unlock()
	if !ok || s == nil {
		return nil, pyErr(excNoSession, "session %s does not exist", pyRepr(name))
	}
	s.close()
	return map[string]any{"session_type": "bash"}, nil
}

func (h *Handler) closeRuntime(ctx context.Context, r *http.Request, rt *runtime, box Box) (any, error) {
	rt.closeAll()
	return map[string]any{}, nil
}

func ptr[T any](v T) *T { return &v }
