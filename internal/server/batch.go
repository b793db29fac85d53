package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/store"
)

// batchInsertChunk bounds one bulk insert: a batch of 32,768 records goes
// to the store in transactions of this many, so that other writers (single
// creates, deletes) wait for one chunk, not for the whole batch.
const batchInsertChunk = 4096

// batchProgressEvery is how often a streamed batch reports progress; it is
// also the heartbeat that keeps idle-read timeouts of clients from firing.
const batchProgressEvery = 250 * time.Millisecond

// batch is one batch create in flight.
type batch struct {
	id    string
	p     plan
	items []api.BatchItem
	recs  []*store.Sandbox // by index; nil when the item was never recorded

	mu      sync.Mutex // guards the counters and emit
	placed  int
	created int
	failed  int
	emit    func(api.BatchEvent) // nil when not streaming
}

func (b *batch) finish(i int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.items[i].Error != nil {
		b.failed++
	} else {
		b.created++
	}
	if b.emit != nil {
		it := b.items[i]
		b.emit(api.BatchEvent{Item: &it})
	}
}

func (b *batch) progress() api.BatchProgress {
	b.mu.Lock()
	defer b.mu.Unlock()
	return api.BatchProgress{Total: len(b.items), Placed: b.placed, Created: b.created, Failed: b.failed}
}

func itemError(err error) *api.Error {
	return &api.Error{Code: errdefs.Code(err), Message: err.Error()}
}

// createBatch is POST /v1/sandboxes:batch. Placement is one scheduler call
// for the whole batch, records are inserted in bulk, and the nodes build
// the sandboxes with bounded parallelism each. Items fail on their own:
// partial success is normal. If the client goes away before it has the
// result, the batch stops starting new sandboxes and destroys the ones it
// made, as a single create does.
func (s *Server) createBatch(w http.ResponseWriter, r *http.Request) error {
	var req api.BatchCreateRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.Count < 1 || req.Count > api.MaxBatchCount {
		return errdefs.Invalid("count %d: want 1 to %d", req.Count, api.MaxBatchCount)
	}
	if req.Backend == api.BackendFnCall {
		return errdefs.Invalid("batch create of fncall sandboxes is not supported: use POST /v1/fncall or single creates")
	}
	if err := checkServerLabels(req.Labels); err != nil {
		return err
	}
	if len(req.Labels) >= 64 {
		return errdefs.Invalid("at most 63 labels in a batch (the server adds %s)", api.LabelBatch)
	}
	tenant := principalFrom(r.Context()).Tenant
	p, err := s.validate(r.Context(), tenant, req.CreateSandboxRequest)
	if err != nil {
		return err
	}
	b := &batch{id: "bt-" + randomID(10), p: p, items: make([]api.BatchItem, req.Count),
		recs: make([]*store.Sandbox, req.Count)}
	labels := map[string]string{api.LabelBatch: b.id}
	for k, v := range p.req.Labels {
		labels[k] = v
	}
	b.p.req.Labels = labels

	stream := strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")
	var stopProgress func()
	if stream {
		var wmu sync.Mutex
		rc := http.NewResponseController(w)
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		write := func(ev api.BatchEvent) {
			wmu.Lock()
			defer wmu.Unlock()
			if r.Context().Err() == nil && enc.Encode(ev) == nil {
				rc.Flush()
			}
		}
		b.emit = write
		stopProgress = s.batchHeartbeat(b, write)
	}

	start := time.Now()
	s.runBatch(context.WithoutCancel(r.Context()), r.Context(), tenant, b)
	if stopProgress != nil {
		stopProgress()
	}
	res := &api.BatchResult{Batch: b.id, Requested: req.Count, DurationMs: time.Since(start).Milliseconds()}
	pr := b.progress()
	res.Created, res.Failed = pr.Created, pr.Failed
	if r.Context().Err() != nil {
		s.log.InfoContext(r.Context(), "client left during a batch create; destroying its sandboxes", "batch", b.id, "tenant", tenant,
			"created", res.Created)
		s.destroyBatch(context.WithoutCancel(r.Context()), b)
		return nil // nobody is left to read an answer
	}
	s.log.InfoContext(r.Context(), "batch created", "batch", b.id, "tenant", tenant, "requested", req.Count,
		"created", res.Created, "failed", res.Failed, "duration", time.Since(start))
	if stream {
		b.emit(api.BatchEvent{Result: res})
		return nil
	}
	res.Items = b.items
	httpapi.WriteJSON(w, http.StatusOK, res)
	return nil
}

// batchHeartbeat sends a progress event every batchProgressEvery until the
// returned function is called.
func (s *Server) batchHeartbeat(b *batch, write func(api.BatchEvent)) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(batchProgressEvery)
		defer t.Stop()
		for {
			pr := b.progress()
			write(api.BatchEvent{Progress: &pr})
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		pr := b.progress()
		write(api.BatchEvent{Progress: &pr})
	}
}

// runBatch places, records and builds every item of b. It returns when
// every item is done. Once client is done, items not yet started are
// cancelled rather than built.
//
// The scheduler places the whole batch in one pass (spreading it, see
// scheduler.PlaceBatch); the store inserts the records and charges their
// nodes and tenant chunk by chunk, each chunk in one transaction (the
// authoritative reservation). A chunk the store refuses — another replica
// filled a node, the tenant's quota — is not lost: its items take the
// single create's path one by one, so the batch gets what fits.
func (s *Server) runBatch(ctx, client context.Context, tenant string, b *batch) {
	req := b.p.req
	n := len(b.items)
	for i := range b.items {
		b.items[i].Index = i
	}
	sreq := schedRequest(b.p)
	// Items the scheduler finds no room for now take the single path below
	// (which fails them with the reason, waits for busy nodes in the
	// admission queue, or finds room freed meanwhile). While creates wait
	// there, every item joins them rather than jump the queue.
	var nodes []string
	if s.admission.Stats().Waiting == 0 {
		nodes, _ = s.sched.ReserveBatch(sreq, n)
	}
	now := time.Now().UTC()
	placed := make([]bool, n)
	for i := range b.items {
		sb := s.newRecord(tenant, b.p, now)
		if i < len(nodes) {
			sb.API.Node = nodes[i]
		}
		b.recs[i] = &sb
	}
	for lo := 0; lo < len(nodes); lo += batchInsertChunk {
		hi := min(lo+batchInsertChunk, len(nodes))
		chunk := b.recs[lo:hi]
		err := s.store.PlaceSandboxes(ctx, chunk)
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			for _, sb := range chunk { // an id collided: draw them again
				sb.API.ID = sandboxID(time.Now())
			}
			err = s.store.PlaceSandboxes(ctx, chunk)
		}
		if err != nil {
			for i := lo; i < hi; i++ {
				s.sched.Release(nodes[i], req.Resources)
			}
			if !errors.Is(err, errdefs.ErrResourceExhausted) {
				s.log.WarnContext(ctx, "batch: place a chunk; placing its items one by one", "batch", b.id, "err", err)
			}
			continue
		}
		for i := lo; i < hi; i++ {
			placed[i] = true
			b.items[i].ID, b.items[i].Node, b.items[i].State = b.recs[i].API.ID, nodes[i], api.StateCreating
		}
	}
	b.mu.Lock()
	for _, ok := range placed {
		if ok {
			b.placed++
		}
	}
	b.mu.Unlock()

	// Build on the nodes, a bounded number at a time on each; items the
	// store did not take in bulk go one by one, BatchParallel at a time.
	perNode := map[string][]int{}
	var rest []int
	for i := range b.items {
		if placed[i] {
			perNode[b.recs[i].API.Node] = append(perNode[b.recs[i].API.Node], i)
		} else {
			rest = append(rest, i)
		}
	}
	if len(rest) > 0 {
		perNode[""] = rest
	}
	var wg sync.WaitGroup
	for _, idx := range perNode {
		next := make(chan int)
		for range min(s.cfg.BatchParallel, len(idx)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					s.buildItem(ctx, client, b, i, placed[i])
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(next)
			for _, i := range idx {
				next <- i
			}
		}()
	}
	wg.Wait()
}

// buildItem builds one item of a batch (placed says the store already
// charged its record), or cancels it if the client has gone. A node that
// refuses it is skipped for another, as for a single create.
func (s *Server) buildItem(ctx, client context.Context, b *batch, i int, placed bool) {
	sb := b.recs[i]
	defer b.finish(i)
	if client.Err() != nil {
		err := fmt.Errorf("batch cancelled: the client disconnected: %w", errdefs.ErrUnavailable)
		if placed {
			s.recordFailed(ctx, sb, err)
			s.sched.Release(sb.API.Node, b.p.req.Resources)
		}
		b.items[i].State, b.items[i].Error = api.StateFailed, itemError(err)
		s.metrics.creates.WithLabelValues(b.p.req.Backend, errdefs.Code(err)).Inc()
		return
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, b.p.wait+createTimeoutFor(b.p.req.Backend))
	defer cancel()
	p := b.p
	p.gone = client.Done()
	err := s.placeAndBuild(cctx, sb, p, placed)
	if sb.API.ID != "" && sb.Version > 0 {
		b.items[i].ID, b.items[i].Node = sb.API.ID, sb.API.Node
	}
	if err != nil {
		b.items[i].State, b.items[i].Error = api.StateFailed, itemError(err)
		s.metrics.creates.WithLabelValues(b.p.req.Backend, errdefs.Code(err)).Inc()
		return
	}
	b.items[i].State = api.StateRunning
	s.metrics.creates.WithLabelValues(b.p.req.Backend, "ok").Inc()
	s.metrics.createDur.Observe(time.Since(start).Seconds())
}

// destroyBatch destroys every sandbox a batch built, a bounded number at a
// time.
func (s *Server) destroyBatch(ctx context.Context, b *batch) {
	sem := make(chan struct{}, max(1, s.cfg.BatchParallel))
	var wg sync.WaitGroup
	for i, sb := range b.recs {
		if sb == nil || b.items[i].State != api.StateRunning {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := s.destroy(ctx, *sb); err != nil {
				s.log.WarnContext(ctx, "batch: destroy after the client left", "sandbox", sb.API.ID, "err", err)
			}
		}()
	}
	wg.Wait()
}
