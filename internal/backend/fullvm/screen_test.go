package fullvm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/microvm"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/testutil"
	"github.com/dsec-project/dsec/internal/vmimage"
)

// TestFullVMScreenAndInput boots the small image once (a boot under TCG
// is the slow part) and checks: the guest runs the image's own kernel
// with systemd as init, named after the sandbox; the screen is its text
// console (VGA, root logged in on tty1) and its PNG is not blank; typing
// a command and Enter into the console's shell creates a file the agent
// reads back; the screen changes after the input; bad input is invalid;
// destroy leaves nothing.
func TestFullVMScreenAndInput(t *testing.T) {
	testutil.Require(t, testutil.FullVMRequirements...)
	ctx := context.Background()
	root := t.TempDir()
	b := newFullBackend(t, root)
	sp := backend.Spec{ID: "screen", Layers: []backend.Layer{vmLayer(t)}, Resources: api.Resources{CPU: 1, MemoryMB: 512}}
	if err := b.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), sp.ID) })
	ag := agentOfFull(b, sp.ID)
	res, err := ag.Exec(ctx, &api.ExecRequest{Shell: "uname -r; cat /proc/1/comm; hostname"})
	if err != nil {
		t.Fatal(err)
	}
	host, _ := exec.Command("uname", "-r").Output()
	lines := strings.Split(res.Stdout, "\n")
	if len(lines) < 3 || lines[1] != "systemd" || lines[2] != sp.ID || lines[0] == strings.TrimSpace(string(host)) {
		t.Fatalf("uname -r, init, hostname: %q (host kernel %s)", res.Stdout, host)
	}
	imageKernels, _ := filepath.Glob(filepath.Join(root, "images", "*", "boot.json"))
	if len(imageKernels) != 1 {
		t.Fatalf("kernels copied out of the image: %v", imageKernels)
	}
	var bt vmimage.Boot
	if b, err := os.ReadFile(imageKernels[0]); err != nil || json.Unmarshal(b, &bt) != nil || bt.Version != lines[0] {
		t.Fatalf("the guest runs kernel %s, not the image's (%+v)", lines[0], bt)
	}

	before, d, err := b.Screenshot(ctx, sp.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.Width < 320 || d.Height < 200 {
		t.Fatalf("display %+v", d)
	}
	if lit := litPixels(t, before); lit == 0 {
		t.Fatal("the screen is blank")
	}

	x, y := d.Width, 0
	for _, bad := range []api.InputAction{
		{Type: "teleport"},
		{Type: "click", X: &x, Y: &y},
		{Type: "key", Keys: "ctrl+nokey"},
	} {
		if _, err := b.Input(ctx, sp.ID, []api.InputAction{bad}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("input %+v: %v, want invalid", bad, err)
		}
	}

	// The console's shell may still be starting: type until the file
	// appears, typing again every 2 s, not at every look.
	var typed time.Time
	testutil.Eventually(t, 5*time.Minute, "typing into the console made /tmp/t", func() error {
		if time.Since(typed) >= 2*time.Second {
			if _, err := b.Input(ctx, sp.ID, []api.InputAction{
				{Type: "type", Text: "echo typed > /tmp/t\n"},
			}); err != nil {
				t.Fatal(err)
			}
			typed = time.Now()
		}
		res, err := ag.Exec(ctx, &api.ExecRequest{Shell: "cat /tmp/t 2>/dev/null || true"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "typed\n" {
			return fmt.Errorf("/tmp/t = %q", res.Stdout)
		}
		return nil
	})
	after, _, err := b.Screenshot(ctx, sp.ID)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(before, after) {
		t.Fatal("the screen did not change after typing")
	}
	vnc, err := b.DialVNC(ctx, sp.ID)
	if err != nil {
		t.Fatal(err)
	}
	vnc.SetDeadline(time.Now().Add(time.Minute))
	banner := make([]byte, 12)
	if _, err := io.ReadFull(vnc, banner); err != nil || !strings.HasPrefix(string(banner), "RFB 003.") {
		t.Fatalf("VNC server greeted %q: %v", banner, err)
	}
	vnc.Close()
	if err := b.Destroy(ctx, sp.ID); err != nil {
		t.Fatal(err)
	}
	if leaks := microvm.Leaks(root); len(leaks) > 0 {
		t.Fatalf("after destroy: %v", leaks)
	}
}

// litPixels counts the pixels that are not black.
func litPixels(t *testing.T, b []byte) int {
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	n := 0
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if cr, cg, cb, _ := img.At(x, y).RGBA(); cr|cg|cb != 0 {
				n++
			}
		}
	}
	return n
}
