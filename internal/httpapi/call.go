package httpapi

import (
	"bytes"
	"encoding/json"
	"io"
)

// JSONBody is a request body holding in as JSON, or nil when in is nil.
// It is the sending half of every JSON call dsec makes (the Go client,
// the server's calls to an edge, the edge's to an agent).
func JSONBody(in any) (io.Reader, error) {
	if in == nil {
		return nil, nil
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	return bytes.NewReader(b), nil
}

// ReadJSON decodes a successful response's body into out, or drains it
// when out is nil (so that the connection can be reused), and closes it.
// The error is the decoder's, for the caller to class.
func ReadJSON(body io.ReadCloser, out any) error {
	defer body.Close()
	if out == nil {
		io.Copy(io.Discard, body)
		return nil
	}
	return json.NewDecoder(body).Decode(out)
}
