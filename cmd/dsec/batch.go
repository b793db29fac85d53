package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// createMany is `dsec sandbox create --count N`: one batch request, a
// progress bar on stderr, the ids of the created sandboxes on stdout.
func createMany(ctx context.Context, c *client.Client, req *api.CreateSandboxRequest, count int) error {
	bar := newProgressBar(os.Stderr, count)
	res, err := c.CreateBatch(ctx, &api.BatchCreateRequest{Count: count, CreateSandboxRequest: *req}, bar.update)
	bar.done()
	if err != nil {
		return printErrorCode(err)
	}
	reasons := map[string]int{}
	for _, it := range res.Items {
		if it.Error == nil {
			fmt.Println(it.ID)
			continue
		}
		reasons[it.Error.Message+" ("+it.Error.Code+")"]++
	}
	fmt.Fprintf(os.Stderr, "dsec: batch %s: %d of %d created in %.1fs (label %s=%s)\n", res.Batch, res.Created,
		res.Requested, float64(res.DurationMs)/1000, api.LabelBatch, res.Batch)
	if res.Failed == 0 {
		return nil
	}
	for msg, n := range reasons {
		fmt.Fprintf(os.Stderr, "dsec: %d failed: %s\n", n, msg)
	}
	return exitError(1)
}

// progressBar draws batch progress: a bar redrawn in place on a terminal,
// a line every few seconds otherwise.
type progressBar struct {
	w     io.Writer
	total int
	tty   bool
	start time.Time
	last  time.Time
	drawn bool
}

func newProgressBar(w *os.File, total int) *progressBar {
	st, err := w.Stat()
	return &progressBar{w: w, total: total, tty: err == nil && st.Mode()&os.ModeCharDevice != 0, start: time.Now()}
}

func (b *progressBar) update(p api.BatchProgress) {
	now := time.Now()
	if !b.tty && now.Sub(b.last) < 2*time.Second {
		return
	}
	b.last = now
	done := p.Created + p.Failed
	const width = 30
	fill := 0
	if p.Total > 0 {
		fill = done * width / p.Total
	}
	line := fmt.Sprintf("[%s%s] %d/%d ready, %d failed, %.0fs", strings.Repeat("#", fill), strings.Repeat(".", width-fill),
		p.Created, p.Total, p.Failed, now.Sub(b.start).Seconds())
	if b.tty {
		fmt.Fprintf(b.w, "\r%s", line)
	} else {
		fmt.Fprintln(b.w, line)
	}
	b.drawn = true
}

func (b *progressBar) done() {
	if b.tty && b.drawn {
		fmt.Fprintln(b.w)
	}
}
