package x11

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/screen"
	"github.com/dsec-project/dsec/internal/testutil"
)

// startX runs Xvfb on a free display of this host and returns its name.
func startX(t *testing.T) string {
	t.Helper()
	for n := 90 + os.Getpid()%400; ; n++ {
		if _, err := os.Stat(filepath.Join(SocketDir, fmt.Sprintf("X%d", n))); err == nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/tmp/.X%d-lock", n)); err == nil {
			continue
		}
		name := fmt.Sprintf(":%d", n)
		x := exec.Command("Xvfb", name, "-screen", "0", "640x480x24", "-nolisten", "tcp", "-ac")
		if err := x.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.Process.Kill(); x.Wait() })
		waitFor(t, 10*time.Second, "the X socket", func() bool {
			_, err := os.Stat(filepath.Join(SocketDir, fmt.Sprintf("X%d", n)))
			return err == nil
		})
		return name
	}
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	testutil.EventuallyTrue(t, d, what, ok)
}

// distinct counts the distinct colours of a PNG, up to 3.
func distinct(t *testing.T, b []byte) int {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	seen := map[[3]uint32]bool{}
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y += 2 {
		for x := r.Min.X; x < r.Max.X; x += 2 {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			seen[[3]uint32{cr, cg, cb}] = true
			if len(seen) >= 3 {
				return 3
			}
		}
	}
	return len(seen)
}

// A terminal on an X server of this host: the screenshot shows it, and
// text typed through XTEST reaches its shell.
func TestScreenAndInput(t *testing.T) {
	testutil.Require(t, testutil.Tool("Xvfb"), testutil.Tool("xterm"))
	name := startX(t)
	d, err := Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := d.Size(); got != (api.Display{Width: 640, Height: 480}) {
		t.Fatalf("size %+v", got)
	}
	shot, err := d.Screenshot()
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err := png.DecodeConfig(bytes.NewReader(shot)); err != nil || cfg.Width != 640 || cfg.Height != 480 {
		t.Fatalf("screenshot: %+v %v", cfg, err)
	}
	dir := t.TempDir()
	term := exec.Command("xterm", "-geometry", "80x24+0+0", "-e", "/bin/sh")
	term.Env = append(os.Environ(), "DISPLAY="+name)
	if err := term.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { term.Process.Kill(); term.Wait() })
	waitFor(t, 20*time.Second, "the terminal on the screen", func() bool {
		b, err := d.Screenshot()
		return err == nil && distinct(t, b) >= 2
	})
	file := filepath.Join(dir, "t")
	steps, err := screen.Compile([]api.InputAction{
		{Type: api.InputClick, X: ptr(100), Y: ptr(100)},
		{Type: api.InputType, Text: "echo typed > " + file + "\n"},
	}, d.Size())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Do(ctx, steps); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the typed command's file", func() bool {
		b, err := os.ReadFile(file)
		return err == nil && string(b) == "typed\n"
	})
	// Every step kind reaches the server.
	steps, err = screen.Compile([]api.InputAction{
		{Type: api.InputDrag, From: []int{10, 10}, To: []int{50, 50}},
		{Type: api.InputScroll, X: ptr(5), Y: ptr(5), DY: 2, DX: -1},
		{Type: api.InputKey, Keys: "ctrl+alt+F1"},
		{Type: api.InputClick, X: ptr(639), Y: ptr(479), Button: "right", Count: 2},
	}, d.Size())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Do(ctx, steps); err != nil {
		t.Fatal(err)
	}
}

func TestFindNone(t *testing.T) {
	if _, err := Find(t.TempDir()); err != ErrNoServer {
		t.Fatalf("Find in an empty dir: %v", err)
	}
}

func ptr(n int) *int { return &n }
