package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestPorts reaches services inside a sandbox with network mode none
// through the server: busybox httpd (base:minimal has no Python) with a
// key and, from a real headless Chromium, with a signed URL; a WebSocket
// echo server through the proxy; raw TCP (busybox nc running cat) through
// `dsec sandbox port-forward`. Another tenant's key, an expired token and
// a token of another port are refused; a port nobody listens on is a 404.
func TestPorts(t *testing.T) {
	testutil.Require(t, testutil.Tool("chromium"), testutil.Tool("go"))
	s := startServer(t)
	c := s.Client
	sb := newSandbox(t, c, nil)
	ctx := ctxT(t)
	if sb.Network.Mode != "" && sb.Network.Mode != "none" {
		t.Fatalf("sandbox network %+v, want none", sb.Network)
	}

	// Services: httpd on 8000, the WebSocket echo on 8100, nc+cat on 7000.
	wsecho := filepath.Join(t.TempDir(), "wsecho")
	build := exec.Command("go", "build", "-o", wsecho, "./internal/e2e/testdata/wsecho")
	build.Dir, build.Env = testutil.RepoRoot(), append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build wsecho: %v\n%s", err, out)
	}
	f, err := os.Open(wsecho)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := c.WriteFile(ctx, sb.ID, "/wsecho", f, 0o755); err != nil {
		t.Fatal(err)
	}
	sh(t, c, sb.ID, "mkdir -p /www && echo '<html><body><p id=x>served-from-the-sandbox</p></body></html>' > /www/index.html && httpd -p 8000 -h /www")
	for _, cmd := range []string{"/wsecho 8100", "nc -ll -p 7000 -e /bin/cat"} {
		if _, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: cmd, Background: true}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(url string, key string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	page := s.URL + client.PortPath(sb.ID, 8000, "/index.html")
	eventually(t, 30*time.Second, func() bool {
		code, body := get(page, s.Key)
		return code == 200 && strings.Contains(body, "served-from-the-sandbox")
	})
	if code, body := get(s.URL+client.PortPath(sb.ID, 8001, "/"), s.Key); code != 404 || !strings.Contains(body, "nothing listens on port 8001") {
		t.Fatalf("port nobody listens on: %d %s", code, body)
	}
	for _, p := range []string{"0", "65536", "http"} {
		if code, _ := get(s.URL+"/v1/sandboxes/"+sb.ID+"/ports/"+p+"/", s.Key); code != 400 {
			t.Fatalf("port %s: %d, want 400", p, code)
		}
	}
	if code, _ := get(page, ""); code != 401 {
		t.Fatalf("no key: %d", code)
	}
	tn, err := c.CreateTenant(ctx, "ports-other")
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.CreateKey(ctx, tn.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, other := k.Secret, client.New(s.URL, k.Secret)
	if code, _ := get(page, otherKey); code != 404 {
		t.Fatalf("another tenant's key: %d, want 404", code)
	}
	if _, err := other.PortURL(ctx, sb.ID, 8000, "/", 0); !client.IsNotFound(err) {
		t.Fatalf("another tenant's signed URL: %v", err)
	}

	// Signed URLs: a browser fetches one; expired and other-port tokens fail.
	u, err := c.PortURL(ctx, sb.ID, 8000, "/index.html", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dom := chromiumDOM(t, u.URL)
	if !strings.Contains(dom, `<p id="x">served-from-the-sandbox</p>`) {
		t.Fatalf("chromium got:\n%s", dom)
	}
	if code, _ := get(u.URL, ""); code != 200 {
		t.Fatalf("signed URL: %d", code)
	}
	wrong, err := c.PortURL(ctx, sb.ID, 8100, "/", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := get(page+"?token="+wrong.Token, ""); code != 401 {
		t.Fatalf("token of another port: %d, want 401", code)
	}
	short, err := c.PortURL(ctx, sb.ID, 8000, "/", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() bool { return time.Now().After(short.ExpiresAt) })
	if code, _ := get(page+"?token="+short.Token, ""); code != 401 {
		t.Fatalf("expired token: %d, want 401", code)
	}

	// A WebSocket through the proxy.
	wsURL := "ws" + strings.TrimPrefix(s.URL, "http") + client.PortPath(sb.ID, 8100, "/echo")
	eventually(t, 30*time.Second, func() bool {
		conn, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + s.Key}}})
		if err != nil {
			return false
		}
		defer conn.CloseNow()
		if err := conn.Write(ctx, websocket.MessageText, []byte("echo me")); err != nil {
			t.Fatal(err)
		}
		typ, b, err := conn.Read(ctx)
		if err != nil || typ != websocket.MessageText || string(b) != "echo me" {
			t.Fatalf("websocket echo: %v %q %v", typ, b, err)
		}
		conn.Close(websocket.StatusNormalClosure, "")
		return true
	})

	// Raw TCP through dsec sandbox port-forward.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	local := l.Addr().(*net.TCPAddr).Port
	l.Close()
	pf := exec.Command(filepath.Join(testutil.Binaries(t), "dsec"), "sandbox", "port-forward", sb.ID, fmt.Sprintf("%d:7000", local))
	pf.Env = append(pf.Environ(), "DSEC_URL="+s.URL, "DSEC_API_KEY="+s.Key)
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pf.Process.Kill(); pf.Wait() })
	var conn net.Conn
	eventually(t, 30*time.Second, func() bool {
		conn, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", local))
		return err == nil
	})
	defer conn.Close()
	fmt.Fprintf(conn, "raw line one\nraw line two\n")
	br := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	for _, want := range []string{"raw line one\n", "raw line two\n"} {
		if line, err := br.ReadString('\n'); err != nil || line != want {
			t.Fatalf("through port-forward: %q %v, want %q", line, err, want)
		}
	}
	if _, err := c.DialPort(ctx, sb.ID, 7001); !client.IsNotFound(err) {
		t.Fatalf("tunnel to a port nobody listens on: %v", err)
	}

	// Destroying the sandbox closes its connections.
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	if _, err := br.ReadString('\n'); err != io.EOF {
		t.Fatalf("port-forward connection after destroy: %v, want EOF", err)
	}
}

// chromiumDOM loads url in a real headless Chromium and returns the DOM.
func chromiumDOM(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--dump-dom", url).Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return string(out)
}
