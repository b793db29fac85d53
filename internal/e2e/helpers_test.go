package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// tarFile is one entry of a test tar.
type tarFile struct {
	name, body string
	mode       int64
	typ        byte // tar.TypeReg by default
	link       string
}

func makeTar(t *testing.T, files ...tarFile) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Typeflag: f.typ, Linkname: f.link, Size: int64(len(f.body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(f.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// newSandbox creates a sandbox on base:minimal (or the given layers) and
// destroys it at the end of the test.
func newSandbox(t *testing.T, c *client.Client, layers *api.LayerRefs) *api.Sandbox {
	t.Helper()
	if layers == nil {
		layers = &api.LayerRefs{Base: "base:minimal"}
	}
	sb, err := c.CreateSandbox(ctxT(t), &api.CreateSandboxRequest{
		Layers: layers, Resources: api.Resources{MemoryMB: 128},
	})
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	return sb
}

// sh runs a shell command and fails the test unless it exits 0; it returns
// stdout.
func sh(t *testing.T, c *client.Client, id, cmd string) string {
	t.Helper()
	res, err := c.Exec(ctxT(t), id, &api.ExecRequest{Shell: cmd})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d, stderr %q", cmd, res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

func startServer(t *testing.T, extra ...string) *testutil.Server {
	return testutil.StartServer(t, extra...)
}
