package client

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/dsec-project/dsec/api"
)

// LogOptions say what ProcessLogs reads.
type LogOptions struct {
	Stream string // "stdout", "stderr", or "" for both
	// Offset is where stdout (or the one stream) starts; StderrOffset is
	// stderr's, with both. Offsets before the ring's oldest byte start
	// there.
	Offset, StderrOffset int64
	// Follow keeps reading until the process exits; ProcessLogs then
	// returns its result.
	Follow bool
}

// ProcessLogs reads a background process's output as events (NDJSON),
// calling fn for each piece in the order it was read, and returns the
// process's result once it has exited (with Follow; nil without, or when
// fn stops it with an error).
func (c *Client) ProcessLogs(ctx context.Context, id, proc string, o LogOptions, fn func(api.OutputEvent) error) (*api.ExecResult, error) {
	q := url.Values{"offset": {strconv.FormatInt(o.Offset, 10)}}
	if o.Stream != "" {
		q.Set("stream", o.Stream)
	} else {
		q.Set("stderr_offset", strconv.FormatInt(o.StderrOffset, 10))
	}
	if o.Follow {
		q.Set("follow", "1")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := c.newRequest(ctx, http.MethodGet, procPath(id, proc)+"/output", q, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev api.OutputEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("process logs: %w", err)
		}
		if ev.Exit != nil {
			return ev.Exit, nil
		}
		if err := fn(ev); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("process logs: %w", err)
	}
	if o.Follow {
		return nil, fmt.Errorf("process logs ended without the exit: %w", io.ErrUnexpectedEOF)
	}
	return nil, nil
}

// OutputBytes is an OutputEvent's data, decoded.
func OutputBytes(ev api.OutputEvent) ([]byte, error) {
	if ev.Data == nil {
		return nil, nil
	}
	if ev.Encoding == api.EncodingBase64 {
		return base64.StdEncoding.DecodeString(*ev.Data)
	}
	return []byte(*ev.Data), nil
}
