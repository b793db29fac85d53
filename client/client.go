// Package client is the Go SDK of dsec: a thin, typed wrapper over the HTTP
// API under /v1. It imports only the api package, so programs can vendor it
// without the server. Errors from the server come back as *api.Error, with
// helpers (IsNotFound, Code, ...) to test them.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/httpapi"
)

// Client talks to a dsec server.
type Client struct {
	base string
	key  string
	hc   *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient replaces the HTTP client (its timeout applies to whole
// requests, streams included, so leave it zero and use contexts).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// New returns a client for the server at baseURL (e.g.
// "http://127.0.0.1:7070") authenticating with key.
func New(baseURL, key string, opts ...Option) *Client {
	c := &Client{
		base: strings.TrimSuffix(baseURL, "/"),
		key:  key,
		hc: &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		}},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// FromEnv returns a client for $DSEC_URL (default http://127.0.0.1:7070)
// with $DSEC_API_KEY.
func FromEnv() *Client {
	u := os.Getenv("DSEC_URL")
	if u == "" {
		u = "http://127.0.0.1:7070"
	}
	return New(u, os.Getenv("DSEC_API_KEY"))
}

// Code is the API error code of err, or "" if err is not from the API.
func Code(err error) string {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// IsNotFound reports whether err means the thing does not exist (or
// belongs to another tenant).
func IsNotFound(err error) bool { return Code(err) == api.CodeNotFound }

// IsInvalid reports whether the server rejected the request as malformed.
func IsInvalid(err error) bool { return Code(err) == api.CodeInvalid }

func (c *Client) newRequest(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Request, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	return req, nil
}

// send performs req and returns the response if it is a success; otherwise
// the server's error.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

func readError(resp *http.Response) error { return httpapi.APIError(resp, nil) }

// do sends a JSON request (in may be nil) and decodes a JSON response into
// out (which may be nil).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	body, err := httpapi.JSONBody(in)
	if err != nil {
		return err
	}
	req, err := c.newRequest(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	if err := httpapi.ReadJSON(resp.Body, out); err != nil {
		return fmt.Errorf("decode %s %s response: %w", method, path, err)
	}
	return nil
}

// Health checks that the server answers.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/healthz", nil, nil, nil)
}

// CreateSandbox creates a sandbox and returns it running.
func (c *Client) CreateSandbox(ctx context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// GetSandbox reads a sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions select sandboxes to list.
type ListOptions struct {
	Labels    map[string]string
	Limit     int
	PageToken string
	// All includes deleted and failed sandboxes.
	All bool
	// States, if set, lists only sandboxes in these states.
	States []string
	// Node and Backend, if set, list only sandboxes on that node, of that
	// backend.
	Node, Backend string
}

// ListSandboxes lists one page of the tenant's sandboxes.
func (c *Client) ListSandboxes(ctx context.Context, o ListOptions) (*api.SandboxList, error) {
	q := url.Values{}
	for k, v := range o.Labels {
		q.Add("label", k+"="+v)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.PageToken != "" {
		q.Set("page_token", o.PageToken)
	}
	if o.All {
		q.Set("all", "true")
	}
	if len(o.States) > 0 {
		q.Set("state", strings.Join(o.States, ","))
	}
	if o.Node != "" {
		q.Set("node", o.Node)
	}
	if o.Backend != "" {
		q.Set("backend", o.Backend)
	}
	var out api.SandboxList
	if err := c.do(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CountSandboxes counts the tenant's sandbox records by state and backend
// without listing them; allTenants (an admin key) counts every tenant's.
func (c *Client) CountSandboxes(ctx context.Context, allTenants bool) (*api.SandboxCounts, error) {
	q := url.Values{}
	if allTenants {
		q.Set("all_tenants", "true")
	}
	var out api.SandboxCounts
	if err := c.do(ctx, http.MethodGet, "/v1/sandboxes:count", q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSandbox destroys a sandbox. Deleting it twice is not an error.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, nil)
}

func (c *Client) lifecycle(ctx context.Context, id, op string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/"+op, nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Snapshot saves a sandbox's changes as a new layer (pack_diff) named
// name ("NAME:TAG"; "" for the server's default) and returns it; its Ref
// is what CreateSandboxRequest.Snapshot takes.
func (c *Client) Snapshot(ctx context.Context, id, name string) (*api.Layer, error) {
	var l api.Layer
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/snapshot", nil,
		api.SnapshotRequest{Name: name}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Reset brings a sandbox back to the clean state of its layers.
func (c *Client) Reset(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.lifecycle(ctx, id, "reset")
}

// Pause freezes every process of a sandbox.
func (c *Client) Pause(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.lifecycle(ctx, id, "pause")
}

// Resume thaws a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.lifecycle(ctx, id, "resume")
}

// Exec runs a command and waits for its result.
func (c *Client) Exec(ctx context.Context, id string, req *api.ExecRequest) (*api.ExecResult, error) {
	var res api.ExecResult
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/exec", nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecStream runs a command, calling fn for each stdout/stderr chunk as it
// comes, and returns the final result (without the output, which went to
// fn). An error from fn stops reading and kills the command.
func (c *Client) ExecStream(ctx context.Context, id string, req *api.ExecRequest, fn func(api.ExecEvent) error) (*api.ExecResult, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hr, err := c.newRequest(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/exec", nil, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		// Not a stream: a background exec answers with its handle.
		var res api.ExecResult
		return &res, decode(resp.Body, &res)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev api.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("exec stream: %w", err)
		}
		switch {
		case ev.Exit != nil:
			return ev.Exit, nil
		case ev.Error != nil:
			return nil, ev.Error
		}
		if err := fn(ev); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("exec stream: %w", err)
	}
	return nil, fmt.Errorf("exec stream ended without a result: %w", io.ErrUnexpectedEOF)
}

func filesPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/files" }

// OpenFile streams a file out of a sandbox.
func (c *Client) OpenFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	req, err := c.newRequest(ctx, http.MethodGet, filesPath(id), url.Values{"path": {path}}, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ReadFile reads a whole file from a sandbox.
func (c *Client) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	rc, err := c.OpenFile(ctx, id, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// WriteFile writes a file in a sandbox, creating its parent directories.
// A zero mode means 0644.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode os.FileMode) error {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%#o", mode.Perm()))
	}
	req, err := c.newRequest(ctx, http.MethodPut, filesPath(id), q, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// ListFiles lists a directory in a sandbox.
func (c *Client) ListFiles(ctx context.Context, id, path string) (*api.FileList, error) {
	var out api.FileList
	if err := c.do(ctx, http.MethodGet, filesPath(id), url.Values{"path": {path}, "list": {"1"}}, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveFile removes a file or an empty directory; with recursive, a tree.
func (c *Client) RemoveFile(ctx context.Context, id, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	return c.do(ctx, http.MethodDelete, filesPath(id), q, nil, nil)
}

func decode(r io.Reader, out any) error {
	if err := json.NewDecoder(r).Decode(out); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return nil
}
