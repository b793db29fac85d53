package ui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func get(t *testing.T, method, path string) *http.Response {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("GET /ui/", Handler())
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

func TestServesEmbeddedAssets(t *testing.T) {
	for path, want := range map[string]string{
		"/ui/":          "text/html",
		"/ui/app.js":    "javascript",
		"/ui/api.js":    "javascript",
		"/ui/style.css": "text/css",
	} {
		resp := get(t, "GET", path)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || len(body) == 0 {
			t.Errorf("GET %s: %d, %d bytes", path, resp.StatusCode, len(body))
		}
		if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, want) {
			t.Errorf("GET %s: Content-Type %q, want %s", path, ct, want)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
	}
}

func TestNothingFromElsewhere(t *testing.T) {
	// Works offline: no asset may load anything from another origin.
	for _, path := range []string{"/ui/", "/ui/app.js", "/ui/api.js", "/ui/dom.js", "/ui/terminal.js", "/ui/live.js",
		"/ui/style.css", "/ui/vendor/xterm.js", "/ui/vendor/addon-fit.js", "/ui/vendor/xterm.css"} {
		resp := get(t, "GET", path)
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
		body, _ := io.ReadAll(resp.Body)
		// The SVG namespace is a name, not something loaded; xterm.css
		// credits its origins in a comment.
		for _, name := range []string{`"http://www.w3.org/2000/svg"`, "http://bellard.org/jslinux/", "https://github.com/chjj/term.js"} {
			body = []byte(strings.ReplaceAll(string(body), name, ""))
		}
		for _, bad := range []string{"http://", "https://", "//cdn"} {
			if strings.Contains(string(body), bad) {
				t.Errorf("%s refers to %q", path, bad)
			}
		}
	}
}

func TestUnknownAssetAndMethod(t *testing.T) {
	if code := get(t, "GET", "/ui/nope.js").StatusCode; code != 404 {
		t.Errorf("GET /ui/nope.js: %d, want 404", code)
	}
	if code := get(t, "GET", "/ui/../server.go").StatusCode; code == 200 {
		t.Errorf("GET /ui/../server.go: %d", code)
	}
}
