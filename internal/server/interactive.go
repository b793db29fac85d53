package server

import "net/http"

// terminal upgrades to a WebSocket connected to a command on a
// pseudo-terminal in the sandbox. The upgrade passes through the edge to
// the agent, which runs the terminal; both proxies then copy the
// connection's bytes both ways.
func (s *Server) terminal(w http.ResponseWriter, r *http.Request) error {
	return s.toAgentConn(w, r, "/terminal")
}
