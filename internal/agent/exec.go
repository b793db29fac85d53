package agent

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Limits of an exec request.
const (
	defaultTimeout   = 600_000 * time.Millisecond
	maxTimeoutMs     = 86_400_000
	defaultMaxOutput = 1 << 20
	maxMaxOutput     = 64 << 20
	// maxExecBody fits the largest stdin the agent takes, base64 and all.
	maxExecBody = 96 << 20
	maxTag      = 512
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	ndjson      = "application/x-ndjson"
)

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := decodeJSON(w, r, &req, maxExecBody); err != nil {
		s.writeError(w, r, err)
		return
	}
	spec, err := prepare(&req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	switch {
	case req.Background:
		s.execBackground(w, r, spec)
	case acceptsNDJSON(r):
		s.execStream(w, r, spec)
	default:
		s.execBuffered(w, r, spec)
	}
}

func acceptsNDJSON(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			if mt, _, err := mime.ParseMediaType(part); err == nil && mt == ndjson {
				return true
			}
		}
	}
	return false
}

// CheckExec validates an exec request as the agent would, without
// running anything: the control plane calls it before it records a
// trajectory step, so that a request the agent would refuse is refused
// before anything is written.
func CheckExec(req *api.ExecRequest) error {
	_, err := parse(req)
	return err
}

// prepare validates a request and resolves what it runs. A command that
// cannot start (missing executable or cwd) is not an error here: the spec
// carries the failure to be reported as the command's result.
func prepare(req *api.ExecRequest) (*execSpec, error) {
	spec, err := parse(req)
	if err != nil {
		return nil, err
	}
	if spec.env, err = mergeEnv(os.Environ(), req.Env); err != nil {
		return nil, err
	}
	if spec.tty != nil && !slices.ContainsFunc(spec.env, func(kv string) bool { return strings.HasPrefix(kv, "TERM=") }) {
		spec.env = append(spec.env, "TERM="+defaultTerm)
	}
	spec.argv0, spec.fail = resolve(spec.argv[0], spec.dir, spec.env)
	return spec, nil
}

// parse checks a request and turns it into a spec without its
// environment and executable, which depend on the sandbox.
func parse(req *api.ExecRequest) (*execSpec, error) {
	if req.Trajectory != nil {
		// The control plane records trajectory steps and hands the agent
		// plain execs: one that reaches here unrecorded must not run.
		return nil, errdefs.Invalid("an exec with a trajectory must go through the control plane")
	}
	var argv []string
	switch {
	case len(req.Cmd) > 0 && req.Shell != "":
		return nil, errdefs.Invalid("set one of cmd and shell, not both")
	case len(req.Cmd) > 0:
		if req.Cmd[0] == "" {
			return nil, errdefs.Invalid("cmd[0] is empty")
		}
		argv = req.Cmd
	case req.Shell != "":
		argv = []string{"/bin/sh", "-c", req.Shell}
	default:
		return nil, errdefs.Invalid("one of cmd and shell is required")
	}
	if slices.ContainsFunc(argv, hasNUL) {
		return nil, errdefs.Invalid("command contains a NUL byte")
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsRune(k, '=') || hasNUL(k) || hasNUL(v) {
			return nil, errdefs.Invalid("env: bad variable %q", k)
		}
	}
	dir := req.Cwd
	if dir == "" {
		dir = defaultCwd()
	}
	if !filepath.IsAbs(dir) || hasNUL(dir) {
		return nil, errdefs.Invalid("cwd %q is not an absolute path", dir)
	}
	spec := &execSpec{argv: argv, dir: dir, timeout: defaultTimeout, maxOutput: defaultMaxOutput}
	switch ms := req.TimeoutMs; {
	case ms < 0 || ms > maxTimeoutMs:
		return nil, errdefs.Invalid("timeout_ms %d is out of range [0, %d]", ms, maxTimeoutMs)
	case ms > 0:
		spec.timeout = time.Duration(ms) * time.Millisecond
	case req.Background:
		spec.timeout = 0 // a background service runs until stopped
	}
	switch n := req.MaxOutputBytes; {
	case n < 0 || n > maxMaxOutput:
		return nil, errdefs.Invalid("max_output_bytes %d is out of range [0, %d]", n, maxMaxOutput)
	case n > 0:
		spec.maxOutput = int(n)
	}
	var err error
	switch req.StdinEncoding {
	case api.EncodingUTF8:
		spec.stdin = []byte(req.Stdin)
	case api.EncodingBase64:
		if spec.stdin, err = base64.StdEncoding.DecodeString(req.Stdin); err != nil {
			return nil, errdefs.Invalid("stdin is not base64: %v", err)
		}
	default:
		return nil, errdefs.Invalid("stdin_encoding %q is not \"\" or \"base64\"", req.StdinEncoding)
	}
	if len(spec.stdin) == 0 {
		spec.stdin = nil
	}
	switch {
	case req.Tag != "" && !req.Background:
		return nil, errdefs.Invalid("tag is only for background execs")
	case len(req.Tag) > maxTag || hasNUL(req.Tag):
		return nil, errdefs.Invalid("tag is longer than %d bytes or has a NUL byte", maxTag)
	}
	spec.tag = req.Tag
	if req.StdinOpen && !req.Background {
		return nil, errdefs.Invalid("stdin_open is only for background execs")
	}
	spec.keepStdin = req.StdinOpen
	if req.TTY != nil {
		if err := checkTTYSize(req.TTY.Rows, req.TTY.Cols); err != nil {
			return nil, err
		}
		tty := *req.TTY
		spec.tty = &tty
	}
	return spec, nil
}

func hasNUL(s string) bool { return strings.IndexByte(s, 0) >= 0 }

// mergeEnv lays over on top of base; new variables come last, sorted.
func mergeEnv(base []string, over map[string]string) ([]string, error) {
	keys := make([]string, 0, len(over))
	for k, v := range over {
		if k == "" || strings.ContainsRune(k, '=') || hasNUL(k) || hasNUL(v) {
			return nil, errdefs.Invalid("env: bad variable %q", k)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	env := make([]string, 0, len(base)+len(keys))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := over[k]; !ok {
			env = append(env, kv)
		}
	}
	for _, k := range keys {
		env = append(env, k+"="+over[k])
	}
	return env, nil
}

// resolve checks the cwd and finds the executable the way a shell does:
// a name without a slash is looked up in the command's PATH.
func resolve(name, dir string, env []string) (string, *startError) {
	if fi, err := os.Stat(dir); err != nil {
		return "", &startError{code: 126, msg: fmt.Sprintf("cwd %s: %v", dir, pathErr(err))}
	} else if !fi.IsDir() {
		return "", &startError{code: 126, msg: fmt.Sprintf("cwd %s: %v", dir, unix.ENOTDIR)}
	}
	if strings.ContainsRune(name, '/') {
		return name, nil
	}
	path := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	denied := ""
	for d := range strings.SplitSeq(path, ":") {
		p := filepath.Join(d, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p) // "" and relative entries: the cwd
		}
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			continue
		}
		if fi.Mode()&0o111 == 0 || unix.Access(p, unix.X_OK) != nil {
			if denied == "" {
				denied = p
			}
			continue
		}
		return p, nil
	}
	if denied != "" {
		return "", &startError{code: 126, msg: denied + ": permission denied"}
	}
	return "", &startError{code: 127, msg: name + ": command not found"}
}

// pathErr strips the operation and path from an *fs.PathError.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// execBuffered runs a command to its end and answers with all of its
// result at once.
func (s *Server) execBuffered(w http.ResponseWriter, r *http.Request, spec *execSpec) {
	stdout, stderr := newHeadTail(spec.maxOutput), newHeadTail(spec.maxOutput)
	var res api.ExecResult
	c, err := s.start(spec, stdout, stderr)
	var se *startError
	switch {
	case errors.As(err, &se):
		var msg []byte
		res, msg = se.result()
		_, _ = stderr.Write(msg)
	case err != nil:
		s.writeError(w, r, err)
		return
	default:
		// The request's context ends when the client goes away: that
		// kills the command.
		res = c.result(c.wait(r.Context(), spec.timeout))
	}
	out, outDropped := stdout.bytes()
	errOut, errDropped := stderr.bytes()
	setOutput(&res, out, errOut)
	setDropped(&res, outDropped, errDropped)
	logExec(r, spec, c, &res)
	if r.Context().Err() == nil {
		writeJSON(w, http.StatusOK, &res)
	}
}

// setOutput puts both streams in res, both as base64 if either is not
// valid UTF-8.
func setOutput(res *api.ExecResult, stdout, stderr []byte) {
	if utf8.Valid(stdout) && utf8.Valid(stderr) {
		res.Stdout, res.Stderr = string(stdout), string(stderr)
		return
	}
	res.Stdout = base64.StdEncoding.EncodeToString(stdout)
	res.Stderr = base64.StdEncoding.EncodeToString(stderr)
	res.Encoding = api.EncodingBase64
}

func setDropped(res *api.ExecResult, stdout, stderr int64) {
	res.StdoutDropped, res.StderrDropped = stdout, stderr
	res.Truncated = stdout > 0 || stderr > 0
}

func logExec(r *http.Request, spec *execSpec, c *command, res *api.ExecResult) {
	pid := 0
	if c != nil {
		pid = c.child.pid
	}
	logger(r).InfoContext(r.Context(), "exec", "argv0", spec.argv[0], "pid", pid, "exit_code", res.ExitCode,
		"signal", res.Signal, "timed_out", res.TimedOut, "duration_ms", res.DurationMs)
}

// defaultCwd is where a command without a cwd runs: the sandbox's
// DSEC_WORKDIR (a built layer's WORKDIR) if it is a directory, else /.
func defaultCwd() string {
	if d := os.Getenv("DSEC_WORKDIR"); filepath.IsAbs(d) {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d
		}
	}
	return "/"
}
