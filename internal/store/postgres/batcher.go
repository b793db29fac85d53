package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// Group commit. A placement holds its tenant's usage row locked from its
// charge until its commit, and a commit waits for the WAL to reach disk:
// one transaction per create would let a tenant create only as fast as the
// disk flushes. So placements queued while a transaction runs go into the
// next one together, each in a savepoint (one round trip each: a refused
// charge or a duplicate id rolls back alone), and the one-statement
// "mark running" updates are pipelined, many per transaction, on a
// second worker.
//
// A group transaction locks every node and tenant row its placements
// charge before the first charge, nodes then tenants, each in id order
// (the order every other transaction that holds two of them keeps).
// Charged in its placements' order instead, it deadlocked with another
// replica's: node a, the tenant, then node b, against node b, then the
// tenant. PostgreSQL breaks a deadlock by failing one side after a
// second, and a group fails whole.
const (
	maxPlaceBatch  = 32 // savepoints per transaction: PostgreSQL caches 64 subtransactions
	maxUpdateBatch = 256
)

type placeOp struct {
	sbs []*store.Sandbox
	// nodes and tenants are the rows the placement charges, in id order;
	// queue queues the charges (in that order) and the inserts.
	nodes, tenants []string
	queue          func(b *pgx.Batch)
	err            chan error
}

type updateOp struct {
	id   string // the sandbox's
	args []any
	n    int64
	err  chan error
}

type batcher struct {
	pool    *pgxpool.Pool
	places  chan *placeOp
	updates chan *updateOp
	wg      sync.WaitGroup

	mu     sync.RWMutex
	closed bool
}

func (b *batcher) start(pool *pgxpool.Pool) {
	b.pool = pool
	b.places = make(chan *placeOp, 1024)
	b.updates = make(chan *updateOp, 4096)
	b.wg.Add(2)
	go b.placeLoop()
	go b.updateLoop()
}

func (b *batcher) stop() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.places)
		close(b.updates)
	}
	b.mu.Unlock()
	b.wg.Wait()
}

func (b *batcher) send(ctx context.Context, send func()) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return fmt.Errorf("postgres store is closed: %w", errdefs.ErrUnavailable)
	}
	send()
	return nil
}

// place runs a placement in the next group transaction.
func (b *batcher) place(ctx context.Context, op *placeOp) error {
	op.err = make(chan error, 1)
	if err := b.send(ctx, func() { b.places <- op }); err != nil {
		return err
	}
	return <-op.err
}

// update runs a one-statement live update of sandbox id in the next group
// transaction and returns the rows it changed.
func (b *batcher) update(ctx context.Context, id string, args []any) (int64, error) {
	op := &updateOp{id: id, args: args, err: make(chan error, 1)}
	if err := b.send(ctx, func() { b.updates <- op }); err != nil {
		return 0, err
	}
	err := <-op.err
	return op.n, err
}

func (b *batcher) placeLoop() {
	defer b.wg.Done()
	for op := range b.places {
		batch := []*placeOp{op}
	fill:
		for len(batch) < maxPlaceBatch {
			select {
			case op, ok := <-b.places:
				if !ok {
					break fill
				}
				batch = append(batch, op)
			default:
				break fill
			}
		}
		for attempt := 0; b.runPlaces(batch, attempt < 3); attempt++ {
		}
	}
}

// runPlaces runs a group of placements in one transaction and tells each
// its outcome, unless PostgreSQL aborted the transaction for a deadlock
// (with another replica's transaction) and retry is allowed: then it
// rolls back and reports true, to be run again.
func (b *batcher) runPlaces(batch []*placeOp, retry bool) bool {
	ctx := context.Background()
	errs := make([]error, len(batch))
	finish := func(all error) bool {
		if retry && retryable(all) {
			return true
		}
		for i, op := range batch {
			if all != nil {
				errs[i] = all
			}
			op.err <- errs[i]
		}
		return false
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return finish(fmt.Errorf("begin: %w", err))
	}
	defer tx.Rollback(ctx)
	if err := lockRows(ctx, tx, batch); err != nil {
		return finish(err)
	}
	for i, op := range batch {
		var pb pgx.Batch
		if i > 0 {
			pb.Queue("RELEASE SAVEPOINT op")
		}
		pb.Queue("SAVEPOINT op")
		op.queue(&pb)
		res := tx.SendBatch(ctx, &pb)
		if i > 0 {
			if _, err := res.Exec(); err != nil {
				res.Close()
				return finish(fmt.Errorf("release savepoint: %w", err))
			}
		}
		if _, err := res.Exec(); err != nil {
			res.Close()
			return finish(fmt.Errorf("savepoint: %w", err))
		}
		errs[i] = readPlace(res, op.nodes, op.tenants, op.sbs)
		if cerr := res.Close(); errs[i] == nil && cerr != nil {
			errs[i] = cerr
		}
		if retryable(errs[i]) {
			return finish(errs[i])
		}
		if errs[i] != nil {
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT op"); err != nil {
				return finish(fmt.Errorf("rollback to savepoint: %w", err))
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return finish(fmt.Errorf("commit: %w", err))
	}
	return finish(nil)
}

// lockRows locks the rows a group's placements charge, in one round trip:
// the nodes in id order, then the tenants' usage rows in id order (made
// first if missing, so that two new tenants are not inserted in crossing
// orders either).
func lockRows(ctx context.Context, tx pgx.Tx, batch []*placeOp) error {
	var nodes, tenants []string
	for _, op := range batch {
		nodes = append(nodes, op.nodes...)
		tenants = append(tenants, op.tenants...)
	}
	slices.Sort(nodes)
	slices.Sort(tenants)
	nodes, tenants = slices.Compact(nodes), slices.Compact(tenants)
	var pb pgx.Batch
	pb.Queue(`SELECT id FROM nodes WHERE id = ANY($1) ORDER BY id FOR UPDATE`, nodes)
	pb.Queue(`INSERT INTO tenant_usage (tenant) SELECT t FROM unnest($1::text[]) AS t ORDER BY t
		ON CONFLICT (tenant) DO NOTHING`, tenants)
	pb.Queue(`SELECT tenant FROM tenant_usage WHERE tenant = ANY($1) ORDER BY tenant FOR UPDATE`, tenants)
	if err := tx.SendBatch(ctx, &pb).Close(); err != nil {
		return fmt.Errorf("lock the charged rows: %w", err)
	}
	return nil
}

// retryable reports a transaction PostgreSQL aborted to break a deadlock
// or a serialization conflict.
func retryable(err error) bool {
	c := code(err)
	return c == "40P01" || c == "40001"
}

// readPlace reads the results of a placement's charges and inserts.
func readPlace(res pgx.BatchResults, nodes, tenants []string, sbs []*store.Sandbox) error {
	for _, id := range nodes {
		tag, err := res.Exec()
		if err != nil {
			return fmt.Errorf("charge node %s: %w", id, err)
		}
		if tag.RowsAffected() != 1 {
			return &store.PlaceError{Node: id, Err: store.ErrNodeFull}
		}
	}
	for _, id := range tenants {
		tag, err := res.Exec()
		if err != nil {
			return fmt.Errorf("charge tenant %s: %w", id, err)
		}
		if tag.RowsAffected() != 1 {
			return &store.PlaceError{Tenant: id, Err: store.ErrQuotaExceeded}
		}
	}
	for _, sb := range sbs {
		if _, err := res.Exec(); isUnique(err) {
			return fmt.Errorf("sandbox %s: %w", sb.API.ID, errdefs.ErrAlreadyExists)
		} else if err != nil {
			return fmt.Errorf("insert sandbox: %w", err)
		}
	}
	return nil
}

func (b *batcher) updateLoop() {
	defer b.wg.Done()
	for op := range b.updates {
		batch := []*updateOp{op}
	fill:
		for len(batch) < maxUpdateBatch {
			select {
			case op, ok := <-b.updates:
				if !ok {
					break fill
				}
				batch = append(batch, op)
			default:
				break fill
			}
		}
		b.runUpdates(batch)
	}
}

// runUpdates pipelines one-statement updates in one transaction. They
// cannot fail on their own (a stale version changes no row), so no
// savepoints: an error fails them all, and their callers learn it. They
// run in sandbox id order (two of one sandbox in the order they came),
// so that two replicas' groups (and a node's sandboxes marked lost) lock
// shared rows in one order; one that PostgreSQL aborted anyway runs again.
func (b *batcher) runUpdates(batch []*updateOp) {
	ctx := context.Background()
	slices.SortStableFunc(batch, func(x, y *updateOp) int { return strings.Compare(x.id, y.id) })
	var err error
	for attempt := 0; attempt == 0 || (attempt < 3 && retryable(err)); attempt++ {
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var pb pgx.Batch
			for _, op := range batch {
				pb.Queue(sandboxUpdateLive, op.args...)
			}
			res := tx.SendBatch(ctx, &pb)
			defer res.Close()
			for _, op := range batch {
				tag, err := res.Exec()
				if err != nil {
					return fmt.Errorf("update sandbox: %w", err)
				}
				op.n = tag.RowsAffected()
			}
			return res.Close()
		})
	}
	for _, op := range batch {
		op.err <- err
	}
}
