package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// browser drives one headless Chromium tab against a dsec server's /ui/.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string
	shot string // the screenshots' directory
	n    int
}

func newBrowser(t *testing.T, base string) *browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // start the browser
		t.Fatalf("start chromium: %v", err)
	}
	dir := os.Getenv("DSEC_UI_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return &browser{t: t, ctx: ctx, base: base, shot: dir}
}

// run runs actions with a deadline, failing the test on error.
func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.screenshot("failed")
		b.t.Fatalf("%s: %v", what, err)
	}
}

// waitJS polls a JavaScript expression until it is true.
func (b *browser) waitJS(what, expr string) {
	b.t.Helper()
	err := testutil.Poll(60*time.Second, func() error {
		ok, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
		if err == nil && !ok {
			err = fmt.Errorf("false")
		}
		return err
	})
	if err != nil {
		b.screenshot("failed")
		text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
		b.t.Fatalf("%s: %s never held (err %v); the page says:\n%s", what, expr, err, text)
	}
}

// waitText waits until the element sel holds sub.
func (b *browser) waitText(sel, sub string) {
	b.t.Helper()
	b.waitJS(fmt.Sprintf("%s holds %q", sel, sub),
		fmt.Sprintf("(document.querySelector(%q)?.textContent || '').includes(%q)", sel, sub))
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	return eval[string](b, fmt.Sprintf("document.querySelector(%q)?.textContent || ''", sel))
}

func (b *browser) is(expr string) bool {
	b.t.Helper()
	return eval[bool](b, "!!("+expr+")")
}

func (b *browser) open(hash string) {
	b.t.Helper()
	eval[string](b, fmt.Sprintf("location.hash = %q", hash))
}

func (b *browser) screenshot(name string) {
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	b.n++
	if err := os.WriteFile(filepath.Join(b.shot, fmt.Sprintf("%02d-%s.png", b.n, name)), png, 0o644); err != nil {
		b.t.Log(err)
	}
}

// eval evaluates a JavaScript expression, failing the test on error.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

func (b *browser) signIn(key string) {
	b.t.Helper()
	b.run("sign in",
		chromedp.Navigate(b.base+"/ui/#/signin"),
		chromedp.WaitVisible(chromedp.ID("key")),
		chromedp.SetValue(chromedp.ID("key"), key),
		chromedp.Click(chromedp.CSS("#signin button")))
}

func (b *browser) signOut() {
	b.t.Helper()
	b.run("sign out", chromedp.Click(chromedp.ID("signout")))
	b.waitJS("back at sign-in", "document.querySelector('#signin')")
}

// TestDashboard drives the dashboard in a real headless Chromium against a
// real server with sandboxes on it.
func TestDashboard(t *testing.T) {
	testutil.Require(t, testutil.Tool("chromium"), testutil.File("/bin/busybox"))
	srv := startServer(t)
	ctx := ctxT(t)
	admin := srv.Client

	// Another tenant, with a sandbox the admin tenant must not see.
	ten, err := admin.CreateTenant(ctx, "ui-other")
	if err != nil {
		t.Fatal(err)
	}
	tkey, err := admin.CreateKey(ctx, ten.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	other := client.New(srv.URL, tkey.Secret)
	sbOther := newSandbox(t, other, nil)
	sb := newSandbox(t, admin, nil)

	// A trajectory of two steps, then the trainer sends them again: both replay.
	traj := "job-ui/ep-1"
	for round := 0; round < 2; round++ {
		for step := int64(1); step <= 2; step++ {
			res, err := admin.Exec(ctx, sb.ID, &api.ExecRequest{
				Shell: fmt.Sprintf("echo step %d >> /tmp/log", step), Trajectory: &api.Trajectory{ID: traj, Step: step}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Replayed != (round == 1) {
				t.Fatalf("round %d step %d: replayed %v", round, step, res.Replayed)
			}
		}
	}

	// The API says which steps were replayed.
	log, err := admin.GetTrajectory(ctx, traj)
	if err != nil || len(log.Steps) != 2 || log.Steps[0].Replays != 1 || log.Steps[1].Replays != 1 || log.Steps[1].ReplayedAt == nil {
		t.Fatalf("trajectory after one replay of each step: %+v, %v", log, err)
	}
	// Counts come from the store, by state and backend, per tenant.
	counts, err := admin.CountSandboxes(ctx, false)
	if err != nil || counts.ByState[api.StateRunning] != 1 || counts.ByBackend[sb.Backend] != 1 {
		t.Fatalf("the admin tenant's counts: %+v, %v", counts, err)
	}
	if all, err := admin.CountSandboxes(ctx, true); err != nil || all.ByState[api.StateRunning] != 2 {
		t.Fatalf("every tenant's counts: %+v, %v", all, err)
	}
	if _, err := other.CountSandboxes(ctx, true); client.Code(err) != api.CodePermissionDenied {
		t.Fatalf("a tenant key counting every tenant: %v, want permission denied", err)
	}
	// A snapshot stacked on the base, for the layer page's lineage.
	snap, err := admin.Snapshot(ctx, sb.ID, "ui/snap:v1")
	if err != nil {
		t.Fatal(err)
	}
	// A toolkit layer holding the same busybox as base:minimal: the two
	// share chunks in the layer store.
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	if err := tw.WriteHeader(&tar.Header{Name: "tools/busybox", Mode: 0o755, Size: int64(len(bb)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write(bb)
	tw.Close()
	if _, err := admin.CreateLayer(ctx, api.KindToolkit, "ui/tools:v1", &tb, false); err != nil {
		t.Fatal(err)
	}
	usage, err := admin.LayerUsage(ctx, "base:minimal")
	if err != nil || usage.Usage == nil {
		t.Fatalf("base:minimal's usage: %+v, %v", usage, err)
	}
	if u := usage.Usage; u.Chunks == 0 || u.DedupBytes == 0 || u.SharedChunks == 0 || len(u.SharedWith) == 0 ||
		u.SharedWith[0].Ref != "ui/tools:v1" || len(u.Sandboxes) != 1 || u.Sandboxes[0] != sb.ID ||
		len(u.Lineage.Descendants) != 1 || u.Lineage.Descendants[0].Ref != snap.Ref || u.StoredBytes == nil {
		t.Fatalf("base:minimal's usage: %+v", u)
	}
	signedURLs(t, srv.URL, admin, other, sb.ID, sbOther.ID)

	b := newBrowser(t, srv.URL)

	// Sign in with the admin key: the overview shows the node and the tenant's sandbox.
	b.signIn(srv.Key)
	b.waitJS("overview", "document.querySelector('[data-test=node][data-id=test-node]')")
	b.waitJS("sandbox count", "document.querySelector('[data-test=count-running]')")
	if !b.is("!document.querySelector('[data-nav=tenants]').hidden") {
		t.Error("an admin key does not see the Tenants & keys page")
	}
	b.waitJS("rate charts", "document.querySelectorAll('#stats svg.chart').length === 3")
	b.screenshot("overview-admin")
	// It refreshes itself (every 10 s; here every second), in place.
	eval[int](b, "window.t0 = Date.now()")
	b.open("#/overview?every=1")
	b.waitJS("refreshed", "Number(document.querySelector('#updated')?.dataset.at) > window.t0 + 900 && document.querySelector('[data-test=node]')")

	// The list shows this tenant's sandbox and not the other tenant's.
	b.open("#/sandboxes")
	b.waitText("#sandboxes", sb.ID)
	if strings.Contains(b.text("#sandboxes"), sbOther.ID) {
		t.Errorf("the admin tenant's list shows the other tenant's sandbox %s", sbOther.ID)
	}
	b.screenshot("sandboxes")

	// Open the sandbox and run a command.
	b.run("open sandbox", chromedp.Click(chromedp.CSS(fmt.Sprintf("a[href='#/sandbox/%s']", sb.ID))))
	b.waitText("#sandbox-id", sb.ID)
	b.waitJS("actions", "document.querySelector('[data-action=reset]') && document.querySelector('[data-action=pause]') && !document.querySelector('[data-action=resume]')")

	// A terminal: type a command into xterm.js, see its output.
	b.run("open terminal", chromedp.Click(chromedp.ID("terminal-open")))
	b.waitJS("terminal open", "document.querySelector('#terminal')?.dataset.state === 'open'")
	// Text goes in as the browser's text input (as a keyboard's or an
	// IME's), then the Enter key.
	b.run("type in the terminal",
		chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, input.InsertText, input.InsertTextParams{Text: "echo term-$((6*7))"})
			return err
		}),
		chromedp.KeyEvent(kb.Enter))
	b.waitText("#terminal .xterm-rows", "term-42")
	b.screenshot("terminal")

	// A background process, started from the page, its output followed live.
	b.run("start a background process",
		chromedp.SetValue(chromedp.ID("exec-cmd"), "for i in 1 2 3 4 5 6; do echo tick-$i; sleep 0.3; done; echo done >&2"),
		chromedp.Click(chromedp.ID("exec-bg")),
		chromedp.Click(chromedp.CSS("#exec button")))
	b.waitJS("started", "document.querySelector('#exec-bg-started')")
	b.waitJS("listed", "document.querySelector('#processes [data-follow]')")
	b.run("follow", chromedp.Click(chromedp.CSS("#processes [data-follow]")))
	b.waitText("#proc-out", "tick-3")
	b.waitText("#proc-status", "exit 0")
	b.waitText("#proc-out", "tick-6")
	b.waitText("#proc-out .stderrtext", "done")
	b.screenshot("process-follow")
	b.run("back to one command", chromedp.Click(chromedp.ID("exec-bg")))
	b.run("exec",
		chromedp.SetValue(chromedp.ID("exec-cmd"), "echo hello-from-ui; echo oops >&2; exit 3"),
		chromedp.Click(chromedp.CSS("#exec button")))
	b.waitText("#stdout", "hello-from-ui")
	b.waitText("#stderr", "oops")
	b.waitText("#exit-code", "exit 3")

	// Upload a file from the browser, read it back in the viewer and through the API.
	local := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(local, []byte("uploaded-through-the-dashboard\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b.run("upload",
		chromedp.SetUploadFiles(chromedp.ID("file-upload"), []string{local}),
		chromedp.SetValue(chromedp.ID("upload-path"), "/tmp/notes.txt"),
		chromedp.Click(chromedp.CSS("#file-put button")))
	b.waitText("#file-content", "uploaded-through-the-dashboard")
	got, err := admin.ReadFile(ctx, sb.ID, "/tmp/notes.txt")
	if err != nil || string(got) != "uploaded-through-the-dashboard\n" {
		t.Fatalf("the uploaded file through the API: %q, %v", got, err)
	}
	b.screenshot("sandbox")

	// Reset it: the file is gone.
	b.run("reset", chromedp.Click(chromedp.CSS("[data-action=reset]")))
	b.waitText("#action-msg", "Reset: done")
	if _, err := admin.ReadFile(ctx, sb.ID, "/tmp/notes.txt"); err == nil {
		t.Error("the uploaded file survived the reset")
	}

	// The trajectory's steps as a timeline.
	b.open("#/trajectories?id=" + traj)
	b.waitJS("two steps", "document.querySelectorAll('#timeline [data-test=step]').length === 2")
	b.waitText("#timeline [data-step='2']", "exit 0")
	b.waitText("#timeline", sb.ID)
	b.waitJS("replayed steps", "document.querySelectorAll('#timeline [data-test=step-replayed]').length === 2")
	b.waitText("#timeline [data-step='1'] [data-test=step-replayed]", "replayed ×1")
	b.screenshot("trajectory")

	b.open("#/layers")
	b.waitText("#layers", "base:minimal")
	b.screenshot("layers")

	// A layer's page: its storage after dedup, the sandbox on it, the
	// snapshot stacked on it.
	b.run("open layer", chromedp.Click(chromedp.CSS("a[href='#/layer/base%3Aminimal']")))
	b.waitText("#layer-ref", "base:minimal")
	b.waitText("#layer-usage", "bytes after dedup")
	b.waitText("#layer-sandboxes", sb.ID)
	b.waitText("#lineage", snap.Ref)
	b.waitText("#layer-shares", "ui/tools:v1")
	if strings.Contains(b.text("#layer-sandboxes"), sbOther.ID) {
		t.Error("the layer page lists another tenant's sandbox")
	}
	b.screenshot("layer")

	b.open("#/tenants/" + ten.ID)
	b.waitText("#tenants", "ui-other")
	b.waitJS("keys", "document.querySelectorAll('#keys [data-test=key-row]').length === 1")
	b.screenshot("tenants")

	// A tenant key: its own sandbox only, no admin parts.
	b.signOut()
	b.signIn(tkey.Secret)
	b.waitJS("overview", "document.querySelector('[data-test=count-running]')")
	b.waitText("#updated", "refreshes every 10 s")
	if b.is("document.querySelector('#nodes')") {
		t.Error("a tenant key sees the nodes")
	}
	if !b.is("document.querySelector('[data-nav=tenants]').hidden") {
		t.Error("a tenant key is offered the Tenants & keys page")
	}
	b.screenshot("overview-tenant")
	b.open("#/sandboxes")
	b.waitText("#sandboxes", sbOther.ID)
	if strings.Contains(b.text("#sandboxes"), sb.ID) {
		t.Errorf("a tenant key's list shows the admin tenant's sandbox %s", sb.ID)
	}
	b.open("#/sandbox/" + sb.ID)
	b.waitJS("not found", "document.querySelector('[data-test=error]')")
	b.open("#/tenants")
	b.waitText("[data-test=error]", "admin key")

	// A revoked key goes back to sign-in at its next call.
	if err := admin.DeleteKey(ctx, tkey.ID); err != nil {
		t.Fatal(err)
	}
	b.open("#/layers")
	b.waitJS("back at sign-in", "document.querySelector('#signin [data-test=error]')")
	if !b.is("sessionStorage.getItem('dsec.key') === null") {
		t.Error("the refused key is still in sessionStorage")
	}

	// A bad key does not get past sign-in.
	b.signIn("dsec_aaaaaaaaaaaaa_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb")
	b.waitJS("refused", "document.querySelector('#signin [data-test=error]')")
	b.screenshot("signin-refused")
	b.open("#/overview")
	b.waitJS("still at sign-in", "document.querySelector('#signin')")
}

// signedURLs checks the terminal's signed URL: it opens without a key, for
// that sandbox and route only, and not once changed; another tenant gets
// no URL for the sandbox. (Expiry: TestSignedRoute in internal/server.)
func signedURLs(t *testing.T, base string, admin, other *client.Client, id, otherID string) {
	t.Helper()
	ctx := ctxT(t)
	u, err := admin.TerminalURL(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(u.URL, "ws://") || time.Until(u.ExpiresAt) > time.Minute+time.Second || time.Until(u.ExpiresAt) < 30*time.Second {
		t.Fatalf("terminal URL %s, expires %v", u.URL, u.ExpiresAt)
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(dctx, u.URL+"&cmd=/bin/sh&cmd=-c&cmd=echo+signed-$((40%2B2))", nil) // no key
	if err != nil {
		t.Fatalf("open the signed terminal URL without a key: %v", err)
	}
	var got strings.Builder
	for !strings.Contains(got.String(), "signed-42") {
		typ, data, err := conn.Read(dctx)
		if err != nil {
			t.Fatalf("terminal output %q: %v", got.String(), err)
		}
		if typ == websocket.MessageBinary {
			got.Write(data)
		}
	}
	conn.Close(websocket.StatusNormalClosure, "")

	httpBase := "http" + strings.TrimPrefix(base, "http")
	tok := u.Token
	flip := []byte(tok)
	flip[len(flip)-2] ^= 1
	pu, err := admin.PortURL(ctx, id, 8080, "/", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{
		"another sandbox":  "/v1/sandboxes/" + otherID + "/terminal?token=" + tok,
		"another route":    "/v1/sandboxes/" + id + "/vnc?token=" + tok,
		"tampered":         "/v1/sandboxes/" + id + "/terminal?token=" + string(flip),
		"a port URL's":     "/v1/sandboxes/" + id + "/terminal?token=" + pu.Token,
		"no token, no key": "/v1/sandboxes/" + id + "/terminal",
	} {
		resp, err := http.Get(httpBase + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s token: %s, want 401", name, resp.Status)
		}
	}
	if _, err := other.TerminalURL(ctx, id); client.Code(err) != api.CodeNotFound {
		t.Errorf("another tenant's terminal URL of the sandbox: %v, want not found", err)
	}
	if _, err := other.VNCURL(ctx, id); client.Code(err) != api.CodeNotFound {
		t.Errorf("another tenant's VNC URL of the sandbox: %v, want not found", err)
	}
}
