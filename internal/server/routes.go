package server

import "net/http"

// routeMux is Handler's ServeMux, keeping the patterns registered on it so
// that a test can hold them against api/openapi.yaml. It routes exactly as
// the ServeMux it wraps.
type routeMux struct {
	*http.ServeMux
	patterns []string
}

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}
