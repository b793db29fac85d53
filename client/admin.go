package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/dsec-project/dsec/api"
)

// CreateLayer uploads a layer: a tar stream (plain or gzip) or an EROFS
// image. ref is "name:tag"; kind is api.KindBase, KindWorkspace or
// KindToolkit. Only an admin may make a public layer.
func (c *Client) CreateLayer(ctx context.Context, kind, ref string, r io.Reader, public bool) (*api.Layer, error) {
	q := url.Values{"kind": {kind}, "name": {ref}}
	if public {
		q.Set("public", "1")
	}
	req, err := c.newRequest(ctx, http.MethodPost, "/v1/layers", q, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var l api.Layer
	if err := decode(resp.Body, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// ListLayers lists the tenant's layers and the public ones.
func (c *Client) ListLayers(ctx context.Context) ([]api.Layer, error) {
	var out api.LayerList
	if err := c.do(ctx, http.MethodGet, "/v1/layers", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Layers, nil
}

// GetLayer reads a layer by "name:tag" or "sha256:<digest>".
func (c *Client) GetLayer(ctx context.Context, ref string) (*api.Layer, error) {
	var l api.Layer
	if err := c.do(ctx, http.MethodGet, "/v1/layers/"+ref, nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// LayerUsage gets a layer with its usage: chunks after dedup, chunks
// shared with other layers, the sandboxes on it and its lineage.
func (c *Client) LayerUsage(ctx context.Context, ref string) (*api.Layer, error) {
	var l api.Layer
	if err := c.do(ctx, http.MethodGet, "/v1/layers/"+ref, url.Values{"usage": {"true"}}, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// CreateTenant makes a tenant (admin only).
func (c *Client) CreateTenant(ctx context.Context, name string) (*api.Tenant, error) {
	var t api.Tenant
	if err := c.do(ctx, http.MethodPost, "/v1/tenants", nil, api.CreateTenantRequest{Name: name}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ListTenants lists tenants (admin only).
func (c *Client) ListTenants(ctx context.Context) ([]api.Tenant, error) {
	var out api.TenantList
	if err := c.do(ctx, http.MethodGet, "/v1/tenants", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Tenants, nil
}

// CreateKey makes an API key for a tenant (admin only). The returned key's
// Secret is the only copy of it.
func (c *Client) CreateKey(ctx context.Context, tenant string, admin bool) (*api.APIKey, error) {
	var k api.APIKey
	if err := c.do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(tenant)+"/keys", nil,
		api.CreateKeyRequest{Admin: admin}, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// ListKeys lists a tenant's keys, without their secrets (admin only).
func (c *Client) ListKeys(ctx context.Context, tenant string) ([]api.APIKey, error) {
	var out api.KeyList
	if err := c.do(ctx, http.MethodGet, "/v1/tenants/"+url.PathEscape(tenant)+"/keys", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// DeleteKey revokes a key (admin only).
func (c *Client) DeleteKey(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/keys/"+url.PathEscape(id), nil, nil, nil)
}

// ListNodes lists the cluster's nodes (admin only).
func (c *Client) ListNodes(ctx context.Context) ([]api.Node, error) {
	var out api.NodeList
	if err := c.do(ctx, http.MethodGet, "/v1/nodes", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Nodes, nil
}

// GetNode reads one node (admin only).
func (c *Client) GetNode(ctx context.Context, id string) (*api.Node, error) {
	var n api.Node
	if err := c.do(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(id), nil, nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// DrainNode stops a node from taking new sandboxes (drain true) or lets
// it take them again (admin only). Its sandboxes keep running.
func (c *Client) DrainNode(ctx context.Context, id string, drain bool) (*api.Node, error) {
	op := "/drain"
	if !drain {
		op = "/undrain"
	}
	var n api.Node
	if err := c.do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+op, nil, nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// GetTenant reads a tenant with its quota and usage (admin only).
func (c *Client) GetTenant(ctx context.Context, id string) (*api.Tenant, error) {
	var t api.Tenant
	if err := c.do(ctx, http.MethodGet, "/v1/tenants/"+url.PathEscape(id), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// SetQuota replaces a tenant's quota; zero fields are unlimited (admin
// only).
func (c *Client) SetQuota(ctx context.Context, tenant string, q api.Quota) (*api.Tenant, error) {
	var t api.Tenant
	if err := c.do(ctx, http.MethodPut, "/v1/tenants/"+url.PathEscape(tenant)+"/quota", nil, q, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

func procPath(id, proc string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + "/processes/" + url.PathEscape(proc)
}

// ListProcesses lists a sandbox's background processes.
func (c *Client) ListProcesses(ctx context.Context, id string) ([]api.Process, error) {
	var out api.ProcessList
	if err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/processes", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Processes, nil
}

// DeleteProcess forgets an exited background process.
func (c *Client) DeleteProcess(ctx context.Context, id, proc string) error {
	return c.do(ctx, http.MethodDelete, procPath(id, proc), nil, nil, nil)
}

// FollowOutput streams a background process's stdout or stderr from
// offset until it exits; the caller closes the reader.
func (c *Client) FollowOutput(ctx context.Context, id, proc, stream string, offset int64) (io.ReadCloser, error) {
	q := url.Values{"stream": {stream}, "offset": {strconv.FormatInt(offset, 10)}, "follow": {"true"}}
	req, err := c.newRequest(ctx, http.MethodGet, procPath(id, proc)+"/output", q, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// GetProcess reads a background process.
func (c *Client) GetProcess(ctx context.Context, id, proc string) (*api.Process, error) {
	var p api.Process
	if err := c.do(ctx, http.MethodGet, procPath(id, proc), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// WaitProcess waits up to timeout for a background process to exit and
// returns its state either way.
func (c *Client) WaitProcess(ctx context.Context, id, proc string, timeout time.Duration) (*api.Process, error) {
	var p api.Process
	q := url.Values{"timeout_ms": {strconv.FormatInt(timeout.Milliseconds(), 10)}}
	if err := c.do(ctx, http.MethodGet, procPath(id, proc)+"/wait", q, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// WaitProcessOutput is WaitProcess, and once the process exited its
// result also carries what the sandbox still holds of its stdout and
// stderr (the last max_output_bytes of each).
func (c *Client) WaitProcessOutput(ctx context.Context, id, proc string, timeout time.Duration) (*api.Process, error) {
	var p api.Process
	q := url.Values{"timeout_ms": {strconv.FormatInt(timeout.Milliseconds(), 10)}, "output": {"1"}}
	if err := c.do(ctx, http.MethodGet, procPath(id, proc)+"/wait", q, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Output is a piece of a background process's output.
type Output struct {
	Data []byte
	// Offset is the stream offset of Data[0]; Next is where to read on.
	Offset, Next int64
	// Dropped counts bytes lost before Offset because the buffer wrapped.
	Dropped int64
}

// ReadOutput reads a background process's stdout or stderr from offset.
func (c *Client) ReadOutput(ctx context.Context, id, proc, stream string, offset int64) (*Output, error) {
	q := url.Values{"stream": {stream}, "offset": {strconv.FormatInt(offset, 10)}}
	req, err := c.newRequest(ctx, http.MethodGet, procPath(id, proc)+"/output", q, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	h := func(k string) int64 { n, _ := strconv.ParseInt(resp.Header.Get(k), 10, 64); return n }
	return &Output{Data: data, Offset: h("X-Dsec-Offset"), Next: h("X-Dsec-Next-Offset"), Dropped: h("X-Dsec-Dropped")}, nil
}

// SignalProcess sends a signal (TERM, KILL, INT, HUP, QUIT, USR1, USR2)
// to a background process's group.
func (c *Client) SignalProcess(ctx context.Context, id, proc, signal string) error {
	return c.do(ctx, http.MethodPost, procPath(id, proc)+"/signal", url.Values{"signal": {signal}}, nil, nil)
}

// WriteStdin writes data to the stdin of a background process started
// with StdinOpen (on a TTY: types it into the terminal). One call takes up
// to 1 MiB; it returns once the process's pipe took all of it.
func (c *Client) WriteStdin(ctx context.Context, id, proc string, data []byte) error {
	req, err := c.newRequest(ctx, http.MethodPost, procPath(id, proc)+"/stdin", nil, bytes.NewReader(data))
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

// CloseStdin closes the stdin of a background process started with
// StdinOpen, so that it reads end of file (on a TTY: types ^D).
func (c *Client) CloseStdin(ctx context.Context, id, proc string) error {
	return c.do(ctx, http.MethodPost, procPath(id, proc)+"/stdin/close", nil, nil, nil)
}

// ResizeProcess sets the window size of a background process's terminal
// (one started with TTY).
func (c *Client) ResizeProcess(ctx context.Context, id, proc string, rows, cols int) error {
	return c.do(ctx, http.MethodPost, procPath(id, proc)+"/resize", nil, &api.TTYSize{Rows: rows, Cols: cols}, nil)
}
