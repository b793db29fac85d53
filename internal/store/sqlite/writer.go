package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/dsec-project/dsec/internal/store/sqlstore"
)

// maxBatch bounds how many writes share one transaction.
const maxBatch = 512

var errClosed = errors.New("sqlite store is closed")

// writer group-commits: SQLite has one writer, so instead of one
// transaction per write (and one WAL append and lock round per commit), the
// writes that arrive while a transaction runs are run together in the next
// one, each inside its own savepoint so that one failing write rolls back
// alone. A caller returns once the transaction holding its write commits.
type writer struct {
	db   *sql.DB
	ops  chan *writeOp
	done chan struct{}
	// stmts are the hot statements, prepared once on the one write
	// connection (parsing a statement costs more than running it).
	stmts map[string]*sql.Stmt
	// wal is the database's write-ahead log; lastCheck is when its size
	// was last looked at.
	wal       string
	lastCheck time.Time

	mu     sync.RWMutex // guards closed against sends on ops
	closed bool
}

type writeOp struct {
	fn  func(tx *sql.Tx) error
	err chan error
}

var opPool = sync.Pool{New: func() any { return &writeOp{err: make(chan error, 1)} }}

// hotStatements are prepared by start.
var hotStatements = []string{
	sqlstore.SandboxInsert, sqlstore.SandboxUpdate, sqlstore.SandboxUpdateLive, sqlstore.StoredGet, sqlstore.SandboxTouch,
	sqlstore.NodeCharge, sqlstore.NodeRelease, sqlstore.TenantCharge, sqlstore.TenantRelease,
	"SAVEPOINT op", "ROLLBACK TO op", "RELEASE op",
}

func (w *writer) start(ctx context.Context, db *sql.DB, wal string) error {
	w.db, w.wal = db, wal
	w.stmts = map[string]*sql.Stmt{}
	for _, q := range hotStatements {
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			return fmt.Errorf("prepare %q: %w", q, err)
		}
		w.stmts[q] = st
	}
	w.ops = make(chan *writeOp, 4*maxBatch)
	w.done = make(chan struct{})
	go w.loop()
	return nil
}

// exec runs q in tx, prepared if it is a hot statement.
func (w *writer) exec(tx *sql.Tx, q string, args ...any) (sql.Result, error) {
	if st, ok := w.stmts[q]; ok {
		return tx.Stmt(st).Exec(args...)
	}
	return tx.Exec(q, args...)
}

// queryRow is exec for a query of one row.
func (w *writer) queryRow(tx *sql.Tx, q string, args ...any) *sql.Row {
	if st, ok := w.stmts[q]; ok {
		return tx.Stmt(st).QueryRow(args...)
	}
	return tx.QueryRow(q, args...)
}

func (w *writer) stop() {
	if w.ops == nil {
		return
	}
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.ops)
	}
	w.mu.Unlock()
	<-w.done
	for _, st := range w.stmts {
		st.Close()
	}
}

// write runs fn in a transaction shared with other writes and returns its
// error once that transaction has committed (or fn's error, its writes
// rolled back). fn must not keep tx. Once queued, the write runs even if
// ctx ends meanwhile: the caller learns its true outcome.
func (w *writer) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	op := opPool.Get().(*writeOp)
	op.fn = fn
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		return errClosed
	}
	select {
	case w.ops <- op:
	case <-ctx.Done():
		w.mu.RUnlock()
		return ctx.Err()
	}
	w.mu.RUnlock()
	err := <-op.err
	op.fn = nil
	opPool.Put(op)
	return err
}

func (w *writer) loop() {
	defer close(w.done)
	batch := make([]*writeOp, 0, maxBatch)
	for op := range w.ops {
		batch = append(batch[:0], op)
	fill:
		for len(batch) < maxBatch {
			select {
			case op, ok := <-w.ops:
				if !ok {
					break fill
				}
				batch = append(batch, op)
			default:
				break fill
			}
		}
		w.run(batch)
		w.trimWAL()
	}
}

// maxWAL is the size past which the writer forces the write-ahead log back
// to its start.
const maxWAL = 256 << 20

// trimWAL keeps the write-ahead log from growing without bound. SQLite's
// automatic checkpoints copy the log into the database but restart it
// only when no reader is using it, and under a steady stream of reads
// (API gets and lists) one always is: the log then grows for as long as
// the load lasts. Once a second the writer looks at its size and, past
// maxWAL, runs a RESTART checkpoint, which waits for the readers of the
// moment to finish (milliseconds: reads are short) so that the next write
// starts the log over (journal_size_limit then truncates the file).
func (w *writer) trimWAL() {
	if w.wal == "" || time.Since(w.lastCheck) < time.Second {
		return
	}
	w.lastCheck = time.Now()
	if fi, err := os.Stat(w.wal); err != nil || fi.Size() < maxWAL {
		return
	}
	w.db.ExecContext(context.Background(), "PRAGMA wal_checkpoint(RESTART)")
}

// run executes a batch in one transaction.
func (w *writer) run(batch []*writeOp) {
	ctx := context.Background() // callers' contexts must not abort others' writes
	errs := make([]error, len(batch))
	finish := func(all error) {
		for i, op := range batch {
			if all != nil {
				errs[i] = all
			}
			op.err <- errs[i]
		}
	}
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		finish(fmt.Errorf("begin: %w", err))
		return
	}
	if len(batch) == 1 {
		if errs[0] = batch[0].fn(tx); errs[0] != nil {
			tx.Rollback()
			finish(nil)
			return
		}
	} else {
		for i, op := range batch {
			if _, err := w.exec(tx, "SAVEPOINT op"); err != nil {
				tx.Rollback()
				finish(fmt.Errorf("savepoint: %w", err))
				return
			}
			if errs[i] = op.fn(tx); errs[i] != nil {
				if _, err := w.exec(tx, "ROLLBACK TO op"); err != nil {
					tx.Rollback()
					finish(fmt.Errorf("rollback to savepoint: %w", err))
					return
				}
			}
			if _, err := w.exec(tx, "RELEASE op"); err != nil {
				tx.Rollback()
				finish(fmt.Errorf("release savepoint: %w", err))
				return
			}
		}
	}
	if err := tx.Commit(); err != nil {
		finish(fmt.Errorf("commit: %w", err))
		return
	}
	finish(nil)
}
