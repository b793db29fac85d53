package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/scheduler"
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
	if _, ok := req.Labels[api.LabelBatch]; ok {
		return errdefs.Invalid("label %s is set by the server", api.LabelBatch)
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
		s.log.Info("client left during a batch create; destroying its sandboxes", "batch", b.id, "tenant", tenant,
			"created", res.Created)
		s.destroyBatch(context.WithoutCancel(r.Context()), b)
		return nil // nobody is left to read an answer
	}
	s.log.Info("batch created", "batch", b.id, "tenant", tenant, "requested", req.Count,
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
func (s *Server) runBatch(ctx, client context.Context, tenant string, b *batch) {
	req := b.p.req
	n := len(b.items)
	for i := range b.items {
		b.items[i].Index = i
	}
	nodes, perr := s.sched.ReserveMany(scheduler.Request{Backend: req.Backend, Resources: req.Resources}, n)
	b.mu.Lock()
	b.placed = len(nodes)
	b.mu.Unlock()
	for i := len(nodes); i < n; i++ {
		b.items[i].State, b.items[i].Error = api.StateFailed, itemError(perr)
		s.metrics.creates.WithLabelValues(req.Backend, errdefs.Code(perr)).Inc()
		b.finish(i)
	}

	now := time.Now().UTC()
	for lo := 0; lo < len(nodes); lo += batchInsertChunk {
		hi := min(lo+batchInsertChunk, len(nodes))
		chunk := make([]*store.Sandbox, 0, hi-lo)
		for i := lo; i < hi; i++ {
			sb := s.newRecord(tenant, b.p, nodes[i], now)
			chunk = append(chunk, &sb)
		}
		if err := s.store.CreateSandboxes(ctx, chunk); err != nil {
			s.log.Warn("batch: record sandboxes", "batch", b.id, "err", err)
			for i := lo; i < hi; i++ {
				s.sched.Release(nodes[i], req.Resources)
				b.items[i].State, b.items[i].Error = api.StateFailed, itemError(err)
				s.metrics.creates.WithLabelValues(req.Backend, errdefs.Code(err)).Inc()
				b.finish(i)
			}
			continue
		}
		for j, sb := range chunk {
			i := lo + j
			b.recs[i] = sb
			b.items[i].ID, b.items[i].Node, b.items[i].State = sb.API.ID, sb.API.Node, api.StateCreating
		}
	}

	// Build on the nodes, a bounded number at a time on each.
	perNode := map[string][]int{}
	for i, node := range nodes {
		if b.recs[i] != nil {
			perNode[node] = append(perNode[node], i)
		}
	}
	var wg sync.WaitGroup
	for _, idx := range perNode {
		next := make(chan int)
		for range min(s.cfg.BatchParallel, len(idx)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					s.buildItem(ctx, client, b, i)
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

// buildItem builds one recorded item of a batch, or cancels it if the
// client has gone.
func (s *Server) buildItem(ctx, client context.Context, b *batch, i int) {
	sb := b.recs[i]
	defer b.finish(i)
	if client.Err() != nil {
		err := fmt.Errorf("batch cancelled: the client disconnected: %w", errdefs.ErrUnavailable)
		now := time.Now().UTC()
		sb.API.State, sb.API.Error, sb.DeletedAt = api.StateFailed, err.Error(), &now
		if uerr := s.store.UpdateSandbox(ctx, sb); uerr != nil {
			s.log.Warn("batch: record cancelled item", "sandbox", sb.API.ID, "err", uerr)
		}
		s.sched.Release(sb.API.Node, b.p.req.Resources)
		b.items[i].State, b.items[i].Error = api.StateFailed, itemError(err)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, createTimeout)
	defer cancel()
	if err := s.build(cctx, sb, b.p); err != nil {
		b.items[i].State, b.items[i].Error = api.StateFailed, itemError(err)
		return
	}
	b.items[i].State = api.StateRunning
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
				s.log.Warn("batch: destroy after the client left", "sandbox", sb.API.ID, "err", err)
			}
		}()
	}
	wg.Wait()
}
