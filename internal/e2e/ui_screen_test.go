package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/testutil"
)

// screenColours is a JavaScript expression: the distinct colours (up to
// 3) of the page's screen image, sampled every third pixel (a blank
// screen has one).
const screenColours = `(() => {
  const img = document.querySelector('#screen');
  if (!img || !img.complete || !img.naturalWidth) return 0;
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  const seen = new Set();
  for (let y = 0; y < c.height; y += 3) for (let x = 0; x < c.width; x += 3) {
    const i = (y * c.width + x) * 4;
    seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
    if (seen.size >= 3) return 3;
  }
  return seen.size;
})()`

// TestDashboardScreen drives the sandbox page's screen view in a real
// headless Chromium against a container with the desktop toolkit: the
// screen image loads at the display's size and shows the terminal; a click
// on the image and a line in the page's text box type a command into the
// sandbox's xterm, whose effect the API then reads.
func TestDashboardScreen(t *testing.T) {
	testutil.Require(t, testutil.Tool("chromium"), testutil.Tool("Xvfb"), testutil.Tool("xterm"),
		testutil.Tool("python3"), testutil.Tool("dpkg-query"))
	t0 := time.Now()
	step := func(what string) { t.Logf("%s: %s", time.Since(t0).Round(time.Millisecond), what) }
	s := startServer(t)
	step("server up")
	c := s.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	buildDesktopToolkit(ctx, t, s)
	sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{
		Layers:    &api.LayerRefs{Base: "base:minimal", Toolkit: desktopToolkit},
		Resources: api.Resources{MemoryMB: 256},
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID); step("deleted") })
	t.Cleanup(func() { // before the delete
		if t.Failed() {
			dumpProcesses(t, c, sb.ID)
		}
	})

	step("created")
	b := newBrowser(t, s.URL)
	b.signIn(s.Key)
	b.waitJS("overview", "document.querySelector('[data-test=count-running]')")
	// Opened at once: the X server may not be up yet, and the page shows
	// the screen once it is.
	b.open("#/sandbox/" + sb.ID)
	b.waitText("#sandbox-id", sb.ID)
	b.waitText("#screen-card h2", "Screen (1024×768)")
	b.waitJS("the screen image at the display's size",
		"document.querySelector('#screen')?.complete && document.querySelector('#screen').naturalWidth === 1024 && document.querySelector('#screen').naturalHeight === 768")
	b.waitJS("the terminal on the screen image", screenColours+" >= 2")
	step("screen shown")

	// Click the terminal on the image, at the screen's (200, 200), so it
	// has the keyboard (X without a window manager: the window under the
	// pointer).
	xy := eval[[]float64](b, `(() => {
  const img = document.querySelector('#screen');
  img.scrollIntoView({ block: 'center' });
  const r = img.getBoundingClientRect();
  return [r.left + 200.5 * r.width / img.naturalWidth, r.top + 200.5 * r.height / img.naturalHeight];
})()`)
	b.run("click the terminal on the screen", chromedp.MouseClickXY(xy[0], xy[1]))
	b.run("type a command", chromedp.SendKeys(chromedp.ID("screen-text"), "echo typed > /tmp/t"+kb.Enter))
	step("typed")
	poll(t, 20*time.Second, "the typed command's file", func() bool {
		r, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"cat", "/tmp/t"}})
		return err == nil && r.ExitCode == 0 && r.Stdout == "typed\n"
	})
	if msg := b.text("#screen-msg"); msg != "" {
		t.Errorf("the screen view says %q", msg)
	}
	// Two more frames: the image shows the command typed.
	frames := eval[int](b, "Number(document.querySelector('#screen').dataset.frames)")
	b.waitJS("newer frames", fmt.Sprintf("Number(document.querySelector('#screen').dataset.frames) >= %d", frames+2))
	b.screenshot("screen")
	step("file read back")

	// The X server's socket goes away (as before an X server is up): the
	// page drawn then has no screen, and shows it once the socket is back.
	sh := func(cmd string) {
		t.Helper()
		if r, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: cmd}); err != nil || r.ExitCode != 0 {
			t.Fatalf("%s: %+v, %v", cmd, r, err)
		}
	}
	sh("mv /tmp/.X11-unix/X0 /tmp/X0.away")
	poll(t, 10*time.Second, "no display", func() bool {
		g, err := c.GetSandbox(ctx, sb.ID)
		return err == nil && g.Display == nil
	})
	b.open("#/sandboxes")
	b.open("#/sandbox/" + sb.ID)
	b.waitJS("no screen yet", "document.querySelector('#screen-slot') && !document.querySelector('#screen')")
	sh("mv /tmp/X0.away /tmp/.X11-unix/X0")
	step("slot waiting")
	b.waitJS("the screen once the X server is back",
		"document.querySelector('#screen')?.naturalWidth === 1024 && "+screenColours+" >= 2")

	// A reset from the page takes the desktop down and the agent brings it
	// back: the page shows the new screen.
	b.run("reset", chromedp.Click(chromedp.CSS("[data-action=reset]")))
	step("screen back; reset")
	b.waitText("#action-msg", "Reset: done")
	if _, err := c.ReadFile(ctx, sb.ID, "/tmp/t"); err == nil {
		t.Error("the typed command's file survived the reset")
	}
	b.waitJS("the screen after the reset",
		"document.querySelector('#screen')?.naturalWidth === 1024 && "+screenColours+" >= 2")
	b.waitJS("no error left", "document.querySelector('#screen-msg')?.textContent === ''")
	b.screenshot("screen-reset")
	step("after reset")
}
