package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// exec runs a command in a sandbox. Without a trajectory the request goes
// through to the sandbox's agent on its node, and the result (JSON or an
// NDJSON stream) comes back as the agent writes it. With a trajectory the
// control plane runs it as a step of the trajectory log (execStep).
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	body, err := readExecBody(r, s.cfg.TmpDir)
	if err != nil {
		return err
	}
	defer body.close()
	// Only a body that may name a trajectory (perhaps with escapes) is
	// decoded here; the agent validates the others, and refuses one that
	// names a trajectory.
	if body.contains("trajectory", `\u`) {
		b, err := body.all()
		if err != nil {
			return errdefs.Invalid("read exec body: %v", err)
		}
		var req api.ExecRequest
		if err := decodeStrict(b, &req); err != nil {
			return err
		}
		if req.Trajectory != nil {
			return s.execStep(w, r, &req)
		}
	}
	r.Body, r.ContentLength = body.reader(), body.size
	return s.toAgent(w, r, "/exec")
}

// decodeStrict decodes a whole JSON body, refusing unknown fields and
// trailing data, as httpapi.DecodeJSON does for request bodies.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errdefs.Invalid("empty request body")
		}
		return errdefs.Invalid("malformed JSON body: %v", err)
	}
	if dec.More() {
		return errdefs.Invalid("malformed JSON body: trailing data")
	}
	return nil
}

// acceptsNDJSON reports whether the client asked for a streamed exec.
func acceptsNDJSON(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			if mt, _, err := mime.ParseMediaType(part); err == nil && mt == "application/x-ndjson" {
				return true
			}
		}
	}
	return false
}

// files reads, writes, lists and removes files through the agent, which
// resolves paths inside the sandbox's own root.
func (s *Server) files(w http.ResponseWriter, r *http.Request) error {
	return s.toAgent(w, r, "/files")
}

// processes reads and signals background commands.
func (s *Server) processes(w http.ResponseWriter, r *http.Request) error {
	path := "/procs"
	if rest := r.PathValue("rest"); rest != "" {
		path += "/" + strings.TrimPrefix(rest, "/")
	}
	return s.toAgent(w, r, path)
}

func (s *Server) toAgent(w http.ResponseWriter, r *http.Request, path string) error {
	sb, n, err := s.liveSandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	defer s.begin(r.Context(), sb)()
	n.client.ProxyAgent(w, r, sb.API.ID, path)
	return nil
}
