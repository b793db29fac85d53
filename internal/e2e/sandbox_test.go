package e2e

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// TestSandboxTurns is the core user story: create, run commands turn after
// turn with state kept between them, read and write files, reset to clean,
// destroy.
func TestSandboxTurns(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	sb := newSandbox(t, c, nil)
	if sb.State != api.StateRunning || sb.Node != "test-node" || sb.Backend != api.BackendContainer {
		t.Fatalf("created sandbox: %+v", sb)
	}

	t.Run("state persists between turns", func(t *testing.T) {
		sh(t, c, sb.ID, "mkdir -p /work && echo one > /work/log")
		sh(t, c, sb.ID, "echo two >> /work/log")
		if got := sh(t, c, sb.ID, "cat /work/log"); got != "one\ntwo\n" {
			t.Fatalf("after two turns /work/log = %q", got)
		}
	})

	t.Run("argv, env, cwd, stdin, exit code", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{
			Cmd: []string{"sh", "-c", `pwd; echo "$GREETING"; cat; exit 7`},
			Env: map[string]string{"GREETING": "hi"}, Cwd: "/work", Stdin: "from stdin",
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 7 || res.Stdout != "/work\nhi\nfrom stdin" {
			t.Fatalf("result %+v", res)
		}
	})

	t.Run("files", func(t *testing.T) {
		if err := c.WriteFile(ctx, sb.ID, "/deep/new/dir/f.txt", strings.NewReader("payload"), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := sh(t, c, sb.ID, "stat -c %a /deep/new/dir/f.txt; cat /deep/new/dir/f.txt"); got != "600\npayload" {
			t.Fatalf("written file seen from inside: %q", got)
		}
		b, err := c.ReadFile(ctx, sb.ID, "/work/log")
		if err != nil || string(b) != "one\ntwo\n" {
			t.Fatalf("read file: %q %v", b, err)
		}
		list, err := c.ListFiles(ctx, sb.ID, "/deep/new/dir")
		if err != nil || len(list.Entries) != 1 || list.Entries[0].Name != "f.txt" || list.Entries[0].Size != 7 {
			t.Fatalf("list: %+v %v", list, err)
		}
		if err := c.RemoveFile(ctx, sb.ID, "/deep", true); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ReadFile(ctx, sb.ID, "/deep/new/dir/f.txt"); !client.IsNotFound(err) {
			t.Fatalf("read after remove: %v", err)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		var out, errOut bytes.Buffer
		n := 0
		res, err := c.ExecStream(ctx, sb.ID, &api.ExecRequest{Shell: "for i in 1 2 3; do echo $i; sleep 0.1; done; echo bad >&2; exit 2"},
			func(ev api.ExecEvent) error {
				n++
				b, err := ev.Bytes()
				if ev.Stderr != nil {
					errOut.Write(b)
				} else {
					out.Write(b)
				}
				return err
			})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 2 || out.String() != "1\n2\n3\n" || errOut.String() != "bad\n" || n < 2 {
			t.Fatalf("stream: exit %d, out %q, err %q, %d events", res.ExitCode, out.String(), errOut.String(), n)
		}
	})

	t.Run("timeout and output cap", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "sleep 30", TimeoutMs: 300})
		if err != nil || !res.TimedOut || res.Signal != "SIGKILL" {
			t.Fatalf("timeout: %+v %v", res, err)
		}
		res, err = c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "yes | head -c 1000000", MaxOutputBytes: 1000})
		if err != nil || !res.Truncated || res.StdoutDropped != 1000000-1000 || len(res.Stdout) != 1000 {
			t.Fatalf("cap: truncated=%v dropped=%d len=%d err=%v", res.Truncated, res.StdoutDropped, len(res.Stdout), err)
		}
	})

	t.Run("binary output is base64", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: `printf '\377\376ok'`})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := res.StdoutBytes()
		if res.Encoding != api.EncodingBase64 || string(b) != "\xff\xfeok" {
			t.Fatalf("binary output: %+v", res)
		}
	})

	t.Run("background process", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "echo started; sleep 0.3; echo done", Background: true})
		if err != nil || res.Process == nil {
			t.Fatalf("background exec: %+v %v", res, err)
		}
		p, err := c.WaitProcess(ctx, sb.ID, res.Process.ID, 10*time.Second)
		if err != nil || p.Running || p.Result == nil || p.Result.ExitCode != 0 {
			t.Fatalf("wait: %+v %v", p, err)
		}
		out, err := c.ReadOutput(ctx, sb.ID, res.Process.ID, "stdout", 0)
		if err != nil || string(out.Data) != "started\ndone\n" {
			t.Fatalf("output: %+v %v", out, err)
		}
	})

	t.Run("stdin of a background process", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"cat"}, Background: true, StdinOpen: true})
		if err != nil || res.Process == nil || !res.Process.StdinOpen {
			t.Fatalf("background exec: %+v %v", res, err)
		}
		id := res.Process.ID
		if err := c.WriteStdin(ctx, sb.ID, id, []byte("through the server\n")); err != nil {
			t.Fatal(err)
		}
		if err := c.ResizeProcess(ctx, sb.ID, id, 30, 100); client.Code(err) != api.CodeFailedPrecondition {
			t.Errorf("resize a process without a terminal: %v", err)
		}
		if err := c.CloseStdin(ctx, sb.ID, id); err != nil {
			t.Fatal(err)
		}
		p, err := c.WaitProcessOutput(ctx, sb.ID, id, 10*time.Second)
		if err != nil || p.Running || p.Result == nil || p.Result.ExitCode != 0 || p.Result.Stdout != "through the server\n" {
			t.Fatalf("wait: %+v %v", p, err)
		}
		if err := c.WriteStdin(ctx, sb.ID, id, []byte("late")); client.Code(err) != api.CodeFailedPrecondition {
			t.Errorf("write after exit: %v", err)
		}
	})

	t.Run("reset discards changes and kills processes", func(t *testing.T) {
		sh(t, c, sb.ID, "echo junk > /etc/junk; rm /bin/ls; (sleep 1000 &)")
		got, err := c.Reset(ctx, sb.ID)
		if err != nil || got.State != api.StateRunning {
			t.Fatalf("reset: %+v %v", got, err)
		}
		if out := sh(t, c, sb.ID, "test ! -e /etc/junk && test ! -e /work && ls / >/dev/null && echo clean"); out != "clean\n" {
			t.Fatalf("after reset: %q", out)
		}
		if ps := sh(t, c, sb.ID, "ps -o comm | grep -c sleep || true"); strings.TrimSpace(ps) != "0" {
			t.Fatalf("processes survived reset: %q", ps)
		}
	})

	t.Run("pause and resume", func(t *testing.T) {
		if _, err := c.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "true"}); client.Code(err) != api.CodeFailedPrecondition {
			t.Fatalf("exec on a paused sandbox: %v", err)
		}
		if _, err := c.Resume(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		sh(t, c, sb.ID, "true")
	})

	t.Run("destroy is idempotent and final", func(t *testing.T) {
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatalf("second delete: %v", err)
		}
		if _, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "true"}); !client.IsNotFound(err) {
			t.Fatalf("exec on a deleted sandbox: %v", err)
		}
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil || got.State != api.StateDeleted {
			t.Fatalf("get after delete: %+v %v", got, err)
		}
	})
}

// TestLayerStack stacks a workspace and a toolkit on the base: each layer's
// files appear, upper layers win, and a workspace whiteout hides a base file.
func TestLayerStack(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	ws := makeTar(t,
		tarFile{name: "work/", typ: tar.TypeDir},
		tarFile{name: "work/app.py", body: "print('ws')\n"},
		tarFile{name: "work/shared.txt", body: "from workspace\n"},
		tarFile{name: "etc/.wh.hostname"}, // OCI whiteout: hide the base's /etc/hostname
	)
	if _, err := c.CreateLayer(ctx, api.KindWorkspace, "repo-x:v1", ws, false); err != nil {
		t.Fatal(err)
	}
	tk := makeTar(t,
		tarFile{name: "opt/harness/run.sh", body: "#!/bin/sh\necho harness\n", mode: 0o755},
		tarFile{name: "work/shared.txt", body: "from toolkit\n"},
	)
	if _, err := c.CreateLayer(ctx, api.KindToolkit, "harness:1", tk, false); err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, c, &api.LayerRefs{Base: "base:minimal", Workspace: "repo-x:v1", Toolkit: "harness:1"})
	got := sh(t, c, sb.ID, "cat /work/app.py; /opt/harness/run.sh; cat /work/shared.txt; test -e /etc/hostname || echo whited-out; test -e /etc/passwd && echo base")
	want := "print('ws')\nharness\nfrom toolkit\nwhited-out\nbase\n"
	if got != want {
		t.Fatalf("layer stack view:\n%s\nwant:\n%s", got, want)
	}
	ls, err := c.ListLayers(ctx)
	if err != nil || len(ls) != 3 {
		t.Fatalf("layers: %+v %v", ls, err)
	}
	l, err := c.GetLayer(ctx, ls[0].Digest)
	if err != nil || l.Digest != ls[0].Digest {
		t.Fatalf("get layer by digest: %+v %v", l, err)
	}
}

// TestTenantIsolation: a tenant never sees another tenant's sandboxes or
// layers, and learns nothing from trying (404, as if missing).
func TestTenantIsolation(t *testing.T) {
	s := startServer(t)
	ctx := ctxT(t)
	mk := func(name string) *client.Client {
		tn, err := s.Client.CreateTenant(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		k, err := s.Client.CreateKey(ctx, tn.ID, false)
		if err != nil {
			t.Fatal(err)
		}
		return client.New(s.URL, k.Secret)
	}
	alice, bob := mk("alice"), mk("bob")
	if _, err := alice.CreateLayer(ctx, api.KindWorkspace, "secret:1", makeTar(t, tarFile{name: "flag", body: "x"}), false); err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, alice, nil)

	for name, call := range map[string]func() error{
		"get":    func() error { _, err := bob.GetSandbox(ctx, sb.ID); return err },
		"exec":   func() error { _, err := bob.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "true"}); return err },
		"files":  func() error { _, err := bob.ReadFile(ctx, sb.ID, "/etc/passwd"); return err },
		"reset":  func() error { _, err := bob.Reset(ctx, sb.ID); return err },
		"delete": func() error { return bob.DeleteSandbox(ctx, sb.ID) },
		"layer":  func() error { _, err := bob.GetLayer(ctx, "secret:1"); return err },
		"use layer": func() error {
			_, err := bob.CreateSandbox(ctx, &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal", Workspace: "secret:1"}})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			if err := call(); !client.IsNotFound(err) {
				t.Fatalf("bob's %s on alice's resource: %v, want not_found", name, err)
			}
		})
	}
	list, err := bob.ListSandboxes(ctx, client.ListOptions{})
	if err != nil || len(list.Sandboxes) != 0 {
		t.Fatalf("bob lists %+v, %v", list, err)
	}
	if _, err := bob.ListTenants(ctx); client.Code(err) != api.CodePermissionDenied {
		t.Fatalf("non-admin lists tenants: %v", err)
	}
	sh(t, alice, sb.ID, "true") // still alive after bob's attempts
}

// TestSymlinkEscape: a symlink inside the sandbox that points at host paths
// resolves inside the sandbox.
func TestSymlinkEscape(t *testing.T) {
	s := startServer(t)
	c := s.Client
	sb := newSandbox(t, c, nil)
	sh(t, c, sb.ID, "echo sandbox-secret > /mine; ln -s /../../../../etc/shadow /esc; ln -s ../../../.. /up")
	host, _ := os.ReadFile("/etc/shadow")
	for _, p := range []string{"/esc", "/up/etc/shadow"} {
		b, err := c.ReadFile(ctxT(t), sb.ID, p)
		if err == nil && len(host) > 0 && bytes.Equal(b, host) {
			t.Fatalf("read of %s returned the host's /etc/shadow", p)
		}
		if err != nil && !client.IsNotFound(err) {
			t.Fatalf("read %s: %v", p, err)
		}
	}
	if err := c.WriteFile(ctxT(t), sb.ID, "/up/tmp/dsec-escape-test", strings.NewReader("x"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/tmp/dsec-escape-test"); !errors.Is(err, os.ErrNotExist) {
		os.Remove("/tmp/dsec-escape-test")
		t.Fatal("a write through a symlink reached the host's /tmp")
	}
}
