package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/dsec-project/dsec/api"
)

// BuildOptions are the parameters of a Dockerfile build.
type BuildOptions struct {
	// Name is NAME:TAG of the result.
	Name string
	// Dockerfile is the Dockerfile's path in the context ("Dockerfile").
	Dockerfile string
	// Flatten squashes the result into one layer of Kind (base by
	// default); otherwise it is a snapshot on the stack of its steps.
	Flatten bool
	Kind    string
	// Network is the RUN steps' network: none (default) or open.
	Network string
	// Args are build args (ARG values), KEY=VALUE.
	Args []string
}

// BuildError is a build that failed: the server's error event, with the
// Dockerfile line and a failed RUN's output.
type BuildError struct{ api.BuildError }

func (e *BuildError) Error() string { return e.Message }

// Unwrap gives the error's code to Code.
func (e *BuildError) Unwrap() error { return &api.Error{Code: e.Code, Message: e.Message} }

// BuildLayer builds a layer from a Dockerfile in the build context
// contextTar (a tar stream) and calls fn, if not nil, with every event as
// it comes: steps starting and done, RUN output. A failed build returns a
// *BuildError.
func (c *Client) BuildLayer(ctx context.Context, o BuildOptions, contextTar io.Reader, fn func(api.BuildEvent)) (*api.BuildResult, error) {
	q := url.Values{"name": {o.Name}}
	for k, v := range map[string]string{"dockerfile": o.Dockerfile, "kind": o.Kind, "network": o.Network} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if o.Flatten {
		q.Set("flatten", "true")
	}
	q["arg"] = o.Args
	req, err := c.newRequest(ctx, http.MethodPost, "/v1/layers:build", q, contextTar)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") {
		var out api.BuildResult
		return nil, decode(resp.Body, &out)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev api.BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("build stream: %w", err)
		}
		if fn != nil {
			fn(ev)
		}
		switch {
		case ev.Result != nil:
			return ev.Result, nil
		case ev.Error != nil:
			return nil, &BuildError{*ev.Error}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("build stream: %w", err)
	}
	return nil, fmt.Errorf("build stream ended without a result")
}
