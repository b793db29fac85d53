package agent_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/testutil"
)

func TestExec(t *testing.T) {
	a := startAgent(t)
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "mytool"), []byte("#!/bin/sh\necho mytool \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "noexec"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString

	tests := []struct {
		name       string
		req        api.ExecRequest
		exit       int
		signal     string
		stdout     string
		stderr     string // substring
		encoding   string
		stdoutSame bool // stdout is what stdin was (base64 both)
	}{
		{name: "argv", req: api.ExecRequest{Cmd: []string{"echo", "hello", "world"}}, stdout: "hello world\n"},
		{name: "argv is not shell", req: api.ExecRequest{Cmd: []string{"echo", "$HOME", "*", ";"}}, stdout: "$HOME * ;\n"},
		{name: "shell", req: api.ExecRequest{Shell: "echo a | tr a b; echo c >&2"}, stdout: "b\n", stderr: "c\n"},
		{name: "env merged over the agent's", req: api.ExecRequest{Shell: `echo "$FOO ${PATH:+has-path}"`, Env: map[string]string{"FOO": "bar"}}, stdout: "bar has-path\n"},
		{name: "env overrides", req: api.ExecRequest{Shell: "echo $HOME", Env: map[string]string{"HOME": "/nowhere"}}, stdout: "/nowhere\n"},
		{name: "PATH from the command's env", req: api.ExecRequest{Cmd: []string{"mytool", "x"}, Env: map[string]string{"PATH": bin}}, stdout: "mytool x\n"},
		{name: "cwd", req: api.ExecRequest{Cmd: []string{"pwd"}, Cwd: dir}, stdout: dir + "\n"},
		{name: "default cwd is /", req: api.ExecRequest{Cmd: []string{"pwd"}}, stdout: "/\n"},
		{name: "stdin text", req: api.ExecRequest{Cmd: []string{"cat"}, Stdin: "héllo\nworld"}, stdout: "héllo\nworld"},
		{name: "stdin base64", req: api.ExecRequest{Cmd: []string{"cat"}, Stdin: b64([]byte{0, 1, 0xfe, 0xff}), StdinEncoding: "base64"},
			encoding: api.EncodingBase64, stdoutSame: true},
		{name: "no stdin reads EOF", req: api.ExecRequest{Shell: "cat; echo end"}, stdout: "end\n"},
		{name: "stdin larger than a pipe", req: api.ExecRequest{Shell: "wc -c", Stdin: strings.Repeat("x", 1<<20)}, stdout: "1048576\n"},
		{name: "stdin not read", req: api.ExecRequest{Shell: "echo skipped", Stdin: strings.Repeat("x", 1<<20)}, stdout: "skipped\n"},
		{name: "exit code", req: api.ExecRequest{Shell: "exit 42"}, exit: 42},
		{name: "killed by a signal", req: api.ExecRequest{Shell: "kill -TERM $$"}, exit: 128 + 15, signal: "SIGTERM"},
		{name: "command not found", req: api.ExecRequest{Cmd: []string{"dsec-no-such-command"}}, exit: 127, stderr: "command not found"},
		{name: "path not found", req: api.ExecRequest{Cmd: []string{"/nonexistent/tool"}}, exit: 127, stderr: "no such file"},
		{name: "not executable", req: api.ExecRequest{Cmd: []string{filepath.Join(bin, "noexec")}}, exit: 126, stderr: "permission denied"},
		{name: "not executable in PATH", req: api.ExecRequest{Cmd: []string{"noexec"}, Env: map[string]string{"PATH": bin}}, exit: 126, stderr: "permission denied"},
		{name: "a directory", req: api.ExecRequest{Cmd: []string{bin}}, exit: 126},
		{name: "cwd missing", req: api.ExecRequest{Cmd: []string{"true"}, Cwd: "/nonexistent"}, exit: 126, stderr: "cwd /nonexistent"},
		{name: "non-UTF-8 output is base64, both streams", req: api.ExecRequest{Shell: `printf 'a\377'; echo err >&2`},
			encoding: api.EncodingBase64, stdout: b64([]byte("a\xff")), stderr: b64([]byte("err\n"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := a.Exec(t.Context(), &tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tt.exit || res.Signal != tt.signal {
				t.Errorf("exit %d %q, want %d %q (stderr %q)", res.ExitCode, res.Signal, tt.exit, tt.signal, res.Stderr)
			}
			want := tt.stdout
			if tt.stdoutSame {
				want = tt.req.Stdin
			}
			if res.Stdout != want {
				t.Errorf("stdout %q, want %q", res.Stdout, want)
			}
			if !strings.Contains(res.Stderr, tt.stderr) {
				t.Errorf("stderr %q, want it to contain %q", res.Stderr, tt.stderr)
			}
			if res.Encoding != tt.encoding {
				t.Errorf("encoding %q, want %q", res.Encoding, tt.encoding)
			}
			if res.Truncated || res.TimedOut {
				t.Errorf("truncated %v, timed out %v", res.Truncated, res.TimedOut)
			}
		})
	}
}

func TestExecInvalid(t *testing.T) {
	a := startAgent(t)
	tests := []struct{ name, body string }{
		{"empty body", ""},
		{"not an object", `[1]`},
		{"neither cmd nor shell", `{}`},
		{"empty cmd", `{"cmd":[]}`},
		{"empty cmd[0]", `{"cmd":[""]}`},
		{"both cmd and shell", `{"cmd":["ls"],"shell":"ls"}`},
		{"cmd of the wrong type", `{"cmd":"ls"}`},
		{"timeout of the wrong type", `{"cmd":["ls"],"timeout_ms":"5"}`},
		{"unknown field", `{"cmd":["ls"],"bogus":1}`},
		{"trailing data", `{"cmd":["ls"]} {}`},
		{"negative timeout", `{"cmd":["ls"],"timeout_ms":-1}`},
		{"timeout over a day", `{"cmd":["ls"],"timeout_ms":86400001}`},
		{"output cap over 64 MiB", `{"cmd":["ls"],"max_output_bytes":67108865}`},
		{"bad base64 stdin", `{"cmd":["cat"],"stdin":"!!","stdin_encoding":"base64"}`},
		{"unknown stdin encoding", `{"cmd":["cat"],"stdin":"x","stdin_encoding":"hex"}`},
		{"relative cwd", `{"cmd":["ls"],"cwd":"tmp"}`},
		{"bad env name", `{"cmd":["ls"],"env":{"A=B":"x"}}`},
		{"NUL in argv", `{"cmd":["a\u0000b"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := a.do("POST", "/exec", strings.NewReader(tt.body))
			wantError(t, resp, body, api.CodeInvalid)
		})
	}
	t.Run("client maps the class", func(t *testing.T) {
		_, err := a.Exec(t.Context(), &api.ExecRequest{})
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("err %v, want ErrInvalid", err)
		}
	})
	t.Run("unknown route", func(t *testing.T) {
		resp, body := a.do("GET", "/nope", nil)
		wantError(t, resp, body, api.CodeNotFound)
	})
}

// seqOutput is what `seq 1 n` prints.
func seqOutput(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i) + "\n")
	}
	return b.String()
}

func TestExecOutputCap(t *testing.T) {
	testutil.Require(t, testutil.Tool("seq"), testutil.Tool("yes"), testutil.Tool("head"))
	a := startAgent(t)
	t.Run("head and tail", func(t *testing.T) {
		full := seqOutput(300000)
		res, err := a.Exec(t.Context(), &api.ExecRequest{Shell: "seq 1 300000; echo small >&2", MaxOutputBytes: 1024})
		if err != nil {
			t.Fatal(err)
		}
		want := full[:512] + full[len(full)-512:]
		if res.Stdout != want {
			t.Errorf("stdout %q...%q, want head and tail of 512 bytes", res.Stdout[:32], res.Stdout[len(res.Stdout)-32:])
		}
		if res.StdoutDropped != int64(len(full)-1024) || res.StderrDropped != 0 || !res.Truncated {
			t.Errorf("dropped %d/%d truncated %v, want %d/0 true", res.StdoutDropped, res.StderrDropped, res.Truncated, len(full)-1024)
		}
		if res.Stderr != "small\n" {
			t.Errorf("stderr %q", res.Stderr)
		}
	})
	t.Run("memory stays bounded", func(t *testing.T) {
		const total = 256 << 20
		before := vmHWM(t, a.pid())
		res, err := a.Exec(t.Context(), &api.ExecRequest{Shell: fmt.Sprintf("yes | head -c %d", total), MaxOutputBytes: 1024})
		if err != nil {
			t.Fatal(err)
		}
		y := strings.Repeat("y\n", 256)
		if res.ExitCode != 0 || res.Stdout != y+y || res.StdoutDropped != total-1024 {
			t.Fatalf("exit %d, stdout %d bytes, dropped %d", res.ExitCode, len(res.Stdout), res.StdoutDropped)
		}
		if grew := vmHWM(t, a.pid()) - before; grew > 32<<20 {
			t.Errorf("agent peak memory grew by %d bytes for %d bytes of output", grew, total)
		}
	})
}

// vmHWM is the peak resident memory of a process, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	st, ok := procStatus(pid)
	if !ok {
		t.Fatalf("no process %d", pid)
	}
	kb, err := strconv.ParseInt(strings.TrimSuffix(st["VmHWM"], " kB"), 10, 64)
	if err != nil {
		t.Fatalf("VmHWM %q: %v", st["VmHWM"], err)
	}
	return kb << 10
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	a := startAgent(t)
	res, err := a.Exec(t.Context(), &api.ExecRequest{Shell: "sleep 1000 & echo $!; sleep 1000", TimeoutMs: 300})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.ExitCode != 137 || res.Signal != "SIGKILL" {
		t.Fatalf("timed out %v, exit %d %q; want true, 137 SIGKILL", res.TimedOut, res.ExitCode, res.Signal)
	}
	grandchild := atoiList(t, res.Stdout)
	if len(grandchild) != 1 {
		t.Fatalf("stdout %q: want the grandchild's pid", res.Stdout)
	}
	eventually(t, "the grandchild is killed and reaped", func() bool { return gone(grandchild[0]) })
}

func TestExecLeftoverChild(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// The background sleep keeps the stdout pipe open after the shell exits.
	res, err := a.Exec(ctx, &api.ExecRequest{Shell: "sleep 1000 & echo $!"})
	if err != nil {
		t.Fatalf("exec did not return: %v", err)
	}
	pids := atoiList(t, res.Stdout)
	if res.ExitCode != 0 || len(pids) != 1 {
		t.Fatalf("exit %d stdout %q", res.ExitCode, res.Stdout)
	}
	killAtEnd(t, pids...)
	if dead(pids[0]) {
		t.Errorf("the leftover child was killed after a normal exit")
	}
}

func TestExecClientDisconnect(t *testing.T) {
	a := startAgent(t)
	// The command prints (or writes to a file) the pids of its shell and
	// of a grandchild, then waits forever.
	t.Run("buffered", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "pids")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			_, err := a.Exec(ctx, &api.ExecRequest{Shell: fmt.Sprintf("sleep 1000 & echo $$ $! > %[1]s.tmp; mv %[1]s.tmp %[1]s; wait", file)})
			errc <- err
		}()
		var b []byte
		eventually(t, "the command started", func() bool {
			var err error
			b, err = os.ReadFile(file)
			return err == nil
		})
		pids := atoiList(t, string(b))
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("exec: %v, want context.Canceled", err)
		}
		for _, pid := range pids {
			eventually(t, fmt.Sprintf("pid %d is killed", pid), func() bool { return gone(pid) })
		}
	})
	t.Run("streaming", func(t *testing.T) {
		var pids []int
		_, err := a.ExecStream(t.Context(), &api.ExecRequest{Shell: "sleep 1000 & echo $$ $!; wait"}, func(ev api.ExecEvent) error {
			if ev.Stdout != nil {
				pids = atoiList(t, *ev.Stdout)
				return errStop
			}
			return nil
		})
		if !errors.Is(err, errStop) || len(pids) != 2 {
			t.Fatalf("exec: %v, pids %v", err, pids)
		}
		for _, pid := range pids {
			eventually(t, fmt.Sprintf("pid %d is killed", pid), func() bool { return gone(pid) })
		}
	})
}

// streamed collects the events of a streamed exec.
type streamed struct {
	events         []api.ExecEvent
	stdout, stderr bytes.Buffer
}

func (s *streamed) add(t *testing.T, ev api.ExecEvent) error {
	s.events = append(s.events, ev)
	for _, c := range []struct {
		text *string
		buf  *bytes.Buffer
	}{{ev.Stdout, &s.stdout}, {ev.Stderr, &s.stderr}} {
		if c.text == nil {
			continue
		}
		b := []byte(*c.text)
		if ev.Encoding == api.EncodingBase64 {
			var err error
			if b, err = base64.StdEncoding.DecodeString(*c.text); err != nil {
				t.Fatalf("chunk %q: %v", *c.text, err)
			}
		}
		c.buf.Write(b)
	}
	if (ev.Stdout == nil) == (ev.Stderr == nil) {
		t.Errorf("event %+v: want exactly one of stdout and stderr", ev)
	}
	return nil
}

func TestExecStream(t *testing.T) {
	a := startAgent(t)
	t.Run("events and exit", func(t *testing.T) {
		var s streamed
		res, err := a.ExecStream(t.Context(), &api.ExecRequest{Shell: "echo out1; echo err1 >&2; sleep 0.1; echo out2; exit 3"},
			func(ev api.ExecEvent) error { return s.add(t, ev) })
		if err != nil {
			t.Fatal(err)
		}
		if s.stdout.String() != "out1\nout2\n" || s.stderr.String() != "err1\n" {
			t.Errorf("stdout %q stderr %q", s.stdout.String(), s.stderr.String())
		}
		if res.ExitCode != 3 || res.Stdout != "" || res.Stderr != "" || res.Truncated {
			t.Errorf("exit %+v", res)
		}
	})
	t.Run("output arrives while the command runs", func(t *testing.T) {
		gate := filepath.Join(t.TempDir(), "gate")
		var s streamed
		res, err := a.ExecStream(t.Context(), &api.ExecRequest{
			Shell:     fmt.Sprintf("echo ready; while [ ! -e %s ]; do sleep 0.01; done; echo done", gate),
			TimeoutMs: 60_000,
		}, func(ev api.ExecEvent) error {
			if ev.Stdout != nil && *ev.Stdout == "ready\n" {
				return os.WriteFile(gate, nil, 0o644)
			}
			return s.add(t, ev)
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.TimedOut || res.ExitCode != 0 || s.stdout.String() != "done\n" {
			t.Errorf("exit %+v, stdout %q", res, s.stdout.String())
		}
	})
	t.Run("a character split between writes stays text", func(t *testing.T) {
		var s streamed
		_, err := a.ExecStream(t.Context(), &api.ExecRequest{Shell: `printf '\303'; sleep 0.1; printf '\251\n'`},
			func(ev api.ExecEvent) error { return s.add(t, ev) })
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range s.events {
			if ev.Encoding != "" {
				t.Errorf("event %+v is base64", ev)
			}
		}
		if s.stdout.String() != "é\n" {
			t.Errorf("stdout %q", s.stdout.String())
		}
	})
	t.Run("bytes that are not UTF-8 are base64", func(t *testing.T) {
		var s streamed
		_, err := a.ExecStream(t.Context(), &api.ExecRequest{Shell: `printf 'a\377b'`},
			func(ev api.ExecEvent) error { return s.add(t, ev) })
		if err != nil {
			t.Fatal(err)
		}
		if s.stdout.String() != "a\xffb" || len(s.events) != 1 || s.events[0].Encoding != api.EncodingBase64 {
			t.Errorf("stdout %q, events %+v", s.stdout.String(), s.events)
		}
	})
	t.Run("command not found", func(t *testing.T) {
		var s streamed
		res, err := a.ExecStream(t.Context(), &api.ExecRequest{Cmd: []string{"dsec-no-such-command"}},
			func(ev api.ExecEvent) error { return s.add(t, ev) })
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 127 || !strings.Contains(s.stderr.String(), "command not found") {
			t.Errorf("exit %d, stderr %q", res.ExitCode, s.stderr.String())
		}
	})
	t.Run("invalid request is an HTTP error", func(t *testing.T) {
		_, err := a.ExecStream(t.Context(), &api.ExecRequest{Shell: "true", TimeoutMs: -1}, func(api.ExecEvent) error { return nil })
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("err %v, want ErrInvalid", err)
		}
	})
}

func TestExecStreamCap(t *testing.T) {
	testutil.Require(t, testutil.Tool("seq"))
	a := startAgent(t)
	full := seqOutput(100000)
	var s streamed
	res, err := a.ExecStream(t.Context(), &api.ExecRequest{Shell: "seq 1 100000", MaxOutputBytes: 1000},
		func(ev api.ExecEvent) error { return s.add(t, ev) })
	if err != nil {
		t.Fatal(err)
	}
	if s.stdout.String() != full[:1000] {
		t.Errorf("streamed %d bytes, want the first 1000", s.stdout.Len())
	}
	if res.ExitCode != 0 || !res.Truncated || res.StdoutDropped != int64(len(full)-1000) {
		t.Errorf("exit %+v, want truncated with %d dropped", res, len(full)-1000)
	}
}

// TestExecAnswerHasItsLength: a buffered exec's result, however large,
// is sent with its Content-Length (not chunked), so that the edge's proxy
// passes it on in one write.
func TestExecAnswerHasItsLength(t *testing.T) {
	a := startAgent(t)
	for _, n := range []int{0, 10 << 10} {
		in, _ := json.Marshal(api.ExecRequest{Shell: fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", n)})
		resp, body := a.do("POST", "/exec", bytes.NewReader(in))
		wantStatus(t, resp, body, http.StatusOK)
		if resp.ContentLength != int64(len(body)) || len(resp.TransferEncoding) > 0 {
			t.Errorf("%d bytes of output: Content-Length %d, transfer encoding %v, body of %d bytes", n, resp.ContentLength, resp.TransferEncoding, len(body))
		}
		var res api.ExecResult
		if err := json.Unmarshal(body, &res); err != nil || len(res.Stdout) != n || res.ExitCode != 0 {
			t.Errorf("%d bytes of output: %d bytes, exit %d, %v", n, len(res.Stdout), res.ExitCode, err)
		}
	}
}
