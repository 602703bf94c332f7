package idempotency

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// TxFromContext returns the transaction a transactional route began for its
// handler. Write through it: the writes commit together with the key's
// completed record, or not at all. The middleware owns it: its Commit and
// Rollback return ErrTxManaged and change nothing (answer >= 500 to roll
// back); Begin opens a savepoint as usual. It reports false outside a
// transactional route.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txCtxKey).(pgx.Tx)
	return tx, ok
}

// ErrTxManaged is returned by Commit and Rollback on the transaction
// TxFromContext hands a handler: a handler that committed on its own would
// commit its writes outside the key's fence, and its key could then be
// reclaimed and executed again.
var ErrTxManaged = errors.New("idempotency: the route's transaction is committed or rolled back by the middleware")

// handlerTx is the route's transaction as the handler sees it.
type handlerTx struct{ pgx.Tx }

// Commit refuses: the middleware commits, together with the record.
func (handlerTx) Commit(context.Context) error { return ErrTxManaged }

// Rollback refuses: answer >= 500 (or panic) and the middleware rolls back.
func (handlerTx) Rollback(context.Context) error { return ErrTxManaged }

// withTx returns ctx carrying tx for the handler.
func withTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txCtxKey, pgx.Tx(handlerTx{tx}))
}

// txRunner runs a transactional route (DESIGN.md "Transactional routes"):
// after the claim it begins a transaction, hands it to the handler, and
// commits the handler's writes together with the completed record, fenced
// on the claim's attempt. Nothing is sent before the commit.
type txRunner struct {
	store *PostgresStore
}

func newTxRunner(s Store) (*txRunner, error) {
	pg, ok := s.(*PostgresStore)
	if !ok {
		return nil, errors.New("idempotency: RouteConfig.Transactional needs a *PostgresStore")
	}
	return &txRunner{store: pg}, nil
}

// begin starts the handler's transaction under the store deadline.
func (t *txRunner) begin(rt *route, parent context.Context) (pgx.Tx, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), rt.m.cfg.StoreTimeout)
	defer cancel()
	tx, err := t.store.pool.Begin(ctx)
	if err != nil {
		err = pgStoreError("begin", err)
		rt.m.metrics.storeErrors.WithLabelValues("begin", storeReason(err)).Inc()
	}
	return tx, err
}

// rollback ends a transaction whose writes must not land. A rollback that
// fails leaves nothing behind: the server rolls back when the connection
// goes.
func (t *txRunner) rollback(rt *route, tx pgx.Tx, parent context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), rt.m.cfg.StoreTimeout)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// passThrough gives a request without idempotency tracking its
// transaction too, so the handler has one shape: committed when the handler
// answers below 500 (except 429), rolled back otherwise.
func (t *txRunner) passThrough(rt *route, w http.ResponseWriter, r *http.Request) {
	tx, err := t.begin(rt, r.Context())
	if err != nil {
		rt.m.log.Warn("idempotency: cannot begin the route's transaction", "endpoint", rt.label(r), "error", err)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, bodyUnavailable)
		return
	}
	rec := newRecorder(w, 0, true)
	finished := false
	defer func() {
		if !finished {
			t.rollback(rt, tx, r.Context())
		}
	}()
	rt.next.ServeHTTP(rec, r.WithContext(withTx(r.Context(), tx)))
	finished = true
	if status := rec.statusCode(); status >= 500 || status == http.StatusTooManyRequests {
		t.rollback(rt, tx, r.Context())
		rec.finish()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), rt.m.cfg.StoreTimeout)
	defer cancel()
	if err := tx.Commit(ctx); err != nil {
		t.rollback(rt, tx, r.Context())
		rt.m.log.Error("idempotency: commit failed", "endpoint", rt.label(r), "error", err)
		clear(w.Header())
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, bodyUnavailable)
		return
	}
	rec.finish()
}

// execute runs the handler of a won claim inside a transaction.
func (t *txRunner) execute(rt *route, w http.ResponseWriter, r *http.Request, req ClaimRequest, own Record, claimedAt time.Time, rm *routeMetrics) {
	m := rt.m
	leaseEnd := claimedAt.Add(m.cfg.Lease)
	// Failure outcomes get one attempt (a zero deadline): a stale row on a
	// transactional route is reclaimable, so the client need not wait out
	// the lease for a failing store.
	var once time.Time
	fence := own.Fence()
	tx, err := t.begin(rt, r.Context())
	if err != nil {
		// Nothing ran: give the key back and refuse.
		rt.record(r, req, fence, once, rm, outcomeRelease, Response{})
		m.log.Warn("idempotency: cannot begin the route's transaction; key released",
			"endpoint", req.Endpoint, "key", req.Key, "error", err)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, bodyUnavailable)
		return
	}
	if rt.tooLate(leaseEnd) {
		t.rollback(rt, tx, r.Context()) // first: the release may need its connection
		rt.giveBack(w, r, req, fence, rm)
		return
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(r.Context()), leaseEnd.Add(-m.cfg.StoreTimeout))
	defer cancel()
	ctx = withTx(ctx, tx)
	rec := newRecorder(w, rt.maxResponse, true)
	failed := outcomeFail
	if rt.releaseOnError {
		failed = outcomeRelease // the rollback proves nothing happened
	}
	finished := false
	defer func() {
		if finished {
			return
		}
		p := recover()
		t.rollback(rt, tx, r.Context())
		rt.record(r, req, fence, once, rm, failed, Response{})
		if p != nil { // nil: runtime.Goexit, which carries on by itself
			panic(p)
		}
	}()
	rt.next.ServeHTTP(rec, r.WithContext(ctx))
	finished = true
	cancel()

	switch status := rec.statusCode(); {
	case status == http.StatusTooManyRequests:
		t.rollback(rt, tx, r.Context())
		rt.record(r, req, fence, once, rm, outcomeRelease, Response{})
		rec.finish()
		return
	case status >= 500:
		t.rollback(rt, tx, r.Context())
		rt.record(r, req, fence, once, rm, failed, Response{})
		rec.finish()
		return
	}

	err = t.commit(rt, r.Context(), tx, fence, rec.response(rt.replayHeaders))
	switch {
	case err == nil:
		rec.finish()
	case errors.Is(err, ErrNotOwner):
		// The key was reclaimed while this handler ran: its writes rolled
		// back, and the client gets what any duplicate would.
		m.log.Warn("idempotency: key reclaimed while its handler ran; writes rolled back",
			"endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key)
		clear(w.Header())
		t.answerAsLoser(rt, w, r, req, rm)
	default:
		m.log.Error("idempotency: commit failed; the key is reclaimable after its lease",
			"endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key, "reason", storeReason(err), "error", err)
		rm.recordFailures.Inc()
		clear(w.Header())
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, bodyUnavailable)
	}
}

// commit writes the completed record inside tx, fenced on f, and commits.
// ErrNotOwner means the fence failed and everything was rolled back.
func (t *txRunner) commit(rt *route, parent context.Context, tx pgx.Tx, f Fence, resp Response) error {
	m := rt.m
	_, err := storeCall(m, parent, "complete", m.ops.complete, func(ctx context.Context) (struct{}, error) {
		if err := t.store.completeIn(ctx, tx, f, resp); err != nil {
			return struct{}{}, err
		}
		if err := tx.Commit(ctx); err != nil {
			return struct{}{}, pgStoreError("commit", err)
		}
		return struct{}{}, nil
	})
	if err != nil {
		t.rollback(rt, tx, parent)
	}
	return err
}

// answerAsLoser reads the key again and answers as a duplicate would: the
// reclaimer's replay once it completed, else 409 in flight.
func (t *txRunner) answerAsLoser(rt *route, w http.ResponseWriter, r *http.Request, req ClaimRequest, rm *routeMetrics) {
	m := rt.m
	res, err := storeCall(m, r.Context(), "claim", m.ops.claim, func(c context.Context) (ClaimResult, error) {
		return m.store.Claim(c, req)
	})
	_, label := rt.endpoint(r)
	switch {
	case err != nil:
		rt.storeUnavailable(w, r, label, "claim", err)
	case res.Won:
		// The row vanished (erased or cleaned up) and this claim took the
		// key: nothing ran under it, so give it back and ask for a retry.
		rt.record(r, req, res.Record.Fence(), time.Now().Add(m.cfg.Lease), rm, outcomeRelease, Response{})
		w.Header().Set("Retry-After", "5")
		m.metrics.conflicts.WithLabelValues(label, reasonInFlight).Inc()
		writeJSON(w, http.StatusConflict, bodyInFlight)
	default:
		// Already counted as a miss when it claimed: no hit on top.
		rec := res.Record
		if rec.Status == StatusInFlight {
			rec.LeaseOver = false // its new owner holds a fresh lease
		}
		rt.answerDuplicate(w, r, req, rec, label, rm)
	}
}
