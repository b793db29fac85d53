package server

import "net/http"

// routeMux is Handler's ServeMux, keeping the patterns registered on it so
// that a test can hold them against api/openapi.yaml. It routes exactly as
// the ServeMux it wraps, except for the requests a front surface claims
// before any pattern is matched (E2B's, dispatched by header and host:
// see withE2B).
type routeMux struct {
	*http.ServeMux
	patterns []string
	fronts   []front
}

// front is a surface served ahead of the patterns.
type front struct {
	match func(*http.Request) bool
	h     http.Handler
}

func (m *routeMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for _, f := range m.fronts {
		if f.match(r) {
			f.h.ServeHTTP(w, r)
			return
		}
	}
	m.ServeMux.ServeHTTP(w, r)
}

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}
