package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/dsec-project/dsec/api"
)

// CreateBatch creates req.Count sandboxes from one spec. Partial success
// is normal: check each item's Error. With a non-nil progress the answer is
// streamed and progress is called with the counts as they change (at least
// every quarter second); the items then come from the stream.
func (c *Client) CreateBatch(ctx context.Context, req *api.BatchCreateRequest, progress func(api.BatchProgress)) (*api.BatchResult, error) {
	if progress == nil {
		var out api.BatchResult
		if err := c.do(ctx, http.MethodPost, "/v1/sandboxes:batch", nil, req, &out); err != nil {
			return nil, err
		}
		return &out, nil
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hr, err := c.newRequest(ctx, http.MethodPost, "/v1/sandboxes:batch", nil, bytes.NewReader(b))
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
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") {
		var out api.BatchResult
		return &out, decode(resp.Body, &out)
	}
	items := make([]api.BatchItem, req.Count)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev api.BatchEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("batch stream: %w", err)
		}
		switch {
		case ev.Progress != nil:
			progress(*ev.Progress)
		case ev.Item != nil:
			if ev.Item.Index >= 0 && ev.Item.Index < len(items) {
				items[ev.Item.Index] = *ev.Item
			}
		case ev.Error != nil:
			return nil, ev.Error
		case ev.Result != nil:
			ev.Result.Items = items
			return ev.Result, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("batch stream: %w", err)
	}
	return nil, fmt.Errorf("batch stream ended without a result: %w", io.ErrUnexpectedEOF)
}

// FnCall runs one short command on a warm sandbox of the layer stack.
func (c *Client) FnCall(ctx context.Context, req *api.FnCallRequest) (*api.ExecResult, error) {
	var res api.ExecResult
	if err := c.do(ctx, http.MethodPost, "/v1/fncall", nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// WarmPool makes the FnCall pool of a layer stack hold at least req.Size
// sandboxes.
func (c *Client) WarmPool(ctx context.Context, req *api.FnCallWarmRequest) (*api.FnCallPool, error) {
	var out api.FnCallPool
	if err := c.do(ctx, http.MethodPost, "/v1/fncall/pools", nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListPools lists the tenant's FnCall pools.
func (c *Client) ListPools(ctx context.Context) (*api.FnCallPoolList, error) {
	var out api.FnCallPoolList
	if err := c.do(ctx, http.MethodGet, "/v1/fncall/pools", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
