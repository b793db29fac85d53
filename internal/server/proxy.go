package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// maxExecBody bounds an exec body: the largest stdin the agent takes,
// base64 and all.
const maxExecBody = 96 << 20

// exec runs a command in a sandbox. Without a trajectory the request goes
// through to the sandbox's agent on its node, and the result (JSON or an
// NDJSON stream) comes back as the agent writes it. With a trajectory the
// control plane runs it as a step of the trajectory log (execStep).
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxExecBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("exec body over %d bytes: %w", maxExecBody, errdefs.ErrTooLarge)
		}
		return errdefs.Invalid("read exec body: %v", err)
	}
	// Only a body that may name a trajectory (perhaps with escapes) is
	// decoded here; the agent validates the others.
	if bytes.Contains(body, []byte("trajectory")) || bytes.Contains(body, []byte(`\u`)) {
		var req api.ExecRequest
		if err := decodeStrict(body, &req); err != nil {
			return err
		}
		if req.Trajectory != nil {
			return s.execStep(w, r, &req)
		}
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
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
