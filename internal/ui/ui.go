// Package ui is dsec's web dashboard: static HTML, CSS and JavaScript
// modules embedded in the binary and served at /ui/. The assets hold no
// data and need no key; every piece of data the pages show comes from the
// /v1 API, called by the browser with the API key the user signed in
// with, so the dashboard sees exactly what the key may see (the same
// auth and tenant checks as any other client).
package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// Handler serves the dashboard's assets under /ui/.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// The page talks only to its own origin; nothing is loaded from
		// elsewhere, and it may not be framed. Scripts are only the
		// embedded files; styles may be inline because xterm.js sizes its
		// rows with a <style> element it makes. img-src blob: is the
		// screen (PNGs fetched with the key); connect-src 'self' takes in
		// the terminal's ws:// URL of the same host.
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if strings.HasSuffix(r.URL.Path, "/") || strings.HasSuffix(r.URL.Path, ".html") {
			h.Set("Cache-Control", "no-cache")
		}
		files.ServeHTTP(w, r)
	})
}
