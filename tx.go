package idempotency

import (
	"context"
	"errors"
	"math"
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

// Transaction states as the server reports them after each statement
// (pgconn's TxStatus).
const (
	txIdle    byte = 'I' // no transaction open: the handler ended it with SQL
	txOpen    byte = 'T' // open, as the handler must leave it
	txAborted byte = 'E' // a statement failed and the handler carried on
)

// txState is how the handler left the route's transaction. The handler has
// returned, so nothing else uses the connection.
func txState(tx pgx.Tx) byte { return tx.Conn().PgConn().TxStatus() }

// txBufferFactor is how many times its MaxResponseBytes a transactional
// route buffers at most: nothing may be sent before the commit, so the
// whole response waits in memory.
const txBufferFactor = 4

// bufferCap is a transactional route's buffer cap for a response limit.
func bufferCap(maxResponse int64) int64 {
	if maxResponse > math.MaxInt64/txBufferFactor {
		return math.MaxInt64
	}
	return txBufferFactor * maxResponse
}

// restoreHeader drops every header the handler set, keeping those set
// before it ran (CORS, request ids, HSTS from outer middleware), before the
// middleware answers instead of the handler.
func restoreHeader(h, before http.Header) {
	clear(h)
	for k, v := range before {
		h[k] = v
	}
}

// passThrough gives a request without idempotency tracking its
// transaction too, so the handler has one shape: committed when the handler
// answers below 500 (except 429) from an open transaction, rolled back
// otherwise. A handler that answered from an aborted transaction is
// believed: its answer came after the failed statement, whose writes did
// not happen.
func (t *txRunner) passThrough(rt *route, w http.ResponseWriter, r *http.Request) {
	tx, err := t.begin(rt, r.Context())
	if err != nil {
		rt.m.log.Warn("idempotency: cannot begin the route's transaction", "endpoint", rt.label(r), "error", err)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, bodyUnavailable)
		return
	}
	before := w.Header().Clone()
	rec := newRecorder(w, 0, true)
	rec.holdCap = bufferCap(rt.maxResponse)
	finished := false
	defer func() {
		if !finished {
			t.rollback(rt, tx, r.Context())
		}
	}()
	rt.next.ServeHTTP(rec, r.WithContext(withTx(r.Context(), tx)))
	finished = true
	state := t.checkState(rt, r, tx, rec, "", "")
	switch status := rec.statusCode(); {
	case rec.tooLarge:
		t.rollback(rt, tx, r.Context())
		t.answerTooLarge(rt, w, r, before)
		return
	case state != txOpen, status >= 500, status == http.StatusTooManyRequests:
		t.rollback(rt, tx, r.Context())
		rec.finish()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), rt.m.cfg.StoreTimeout)
	defer cancel()
	if err := tx.Commit(ctx); err != nil {
		t.rollback(rt, tx, r.Context())
		rt.m.log.Error("idempotency: commit failed", "endpoint", rt.label(r), "error", err)
		restoreHeader(w.Header(), before)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, bodyUnavailable)
		return
	}
	rec.finish()
}

// checkState reads how the handler left its transaction and logs what it
// must not do: end the transaction itself with SQL (its writes so far may
// have committed outside the key's fence), or answer success from an
// aborted transaction (its writes did not happen).
func (t *txRunner) checkState(rt *route, r *http.Request, tx pgx.Tx, rec *recorder, scope, key string) byte {
	state := txState(tx)
	switch {
	case state == txIdle:
		rt.m.log.Error("idempotency: the handler ended the route's transaction with SQL (COMMIT or ROLLBACK through Exec); "+
			"its writes escaped the key's fence", "endpoint", rt.label(r), "scope", scope, "key", key, "status", rec.statusCode())
	case state == txAborted && rec.statusCode() < 400 && !rec.tooLarge:
		rt.m.log.Warn("idempotency: the handler answered success from an aborted transaction; its writes did not happen",
			"endpoint", rt.label(r), "scope", scope, "key", key, "status", rec.statusCode())
	}
	return state
}

// answerTooLarge answers a transactional response over the buffer cap,
// whose writes were rolled back.
func (t *txRunner) answerTooLarge(rt *route, w http.ResponseWriter, r *http.Request, before http.Header) {
	label := rt.label(r)
	rt.m.log.Error("idempotency: response over the transactional route's buffer cap; writes rolled back",
		"endpoint", label, "cap_bytes", bufferCap(rt.maxResponse))
	rt.m.metrics.tooLarge.WithLabelValues(label).Inc()
	restoreHeader(w.Header(), before)
	writeJSON(w, http.StatusInternalServerError, bodyRespTooLarge)
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
	before := w.Header().Clone()
	rec := newRecorder(w, rt.maxResponse, true)
	rec.holdCap = bufferCap(rt.maxResponse)
	finished := false
	defer func() {
		if finished {
			return
		}
		p := recover()
		failed := t.failed(rt)
		if t.checkState(rt, r, tx, rec, req.Scope, req.Key) == txIdle {
			failed = outcomeFail // what it committed itself stays: never free the key
		}
		t.rollback(rt, tx, r.Context())
		rt.record(r, req, fence, once, rm, failed, Response{})
		if p != nil { // nil: runtime.Goexit, which carries on by itself
			panic(p)
		}
	}()
	rt.next.ServeHTTP(rec, r.WithContext(ctx))
	finished = true
	cancel()
	t.settle(rt, w, r, req, tx, rec, before, fence, leaseEnd, rm)
}

// failed is the outcome of a handler error whose writes rolled back.
func (t *txRunner) failed(rt *route) outcome {
	if rt.releaseOnError {
		return outcomeRelease // the rollback proves nothing happened
	}
	return outcomeFail
}

// settle ends the route's transaction once its handler returned, records
// the outcome and answers. An aborted transaction (a statement failed and
// the handler caught the error) cannot record anything: it is rolled back
// and the handler's answer recorded outside it. So is one the handler ended
// itself, whose writes may have committed already, so its key is never
// given back.
func (t *txRunner) settle(rt *route, w http.ResponseWriter, r *http.Request, req ClaimRequest, tx pgx.Tx,
	rec *recorder, before http.Header, fence Fence, leaseEnd time.Time, rm *routeMetrics) {
	var once time.Time
	state := t.checkState(rt, r, tx, rec, req.Scope, req.Key)
	status := rec.statusCode()
	switch {
	case rec.tooLarge:
		t.rollback(rt, tx, r.Context())
		rt.record(r, req, fence, once, rm, outcomeFail, Response{})
		t.answerTooLarge(rt, w, r, before)
		return
	case state == txIdle && status >= 500:
		t.rollback(rt, tx, r.Context()) // closes the pgx.Tx; the server has nothing to roll back
		rt.record(r, req, fence, once, rm, outcomeFail, Response{})
	case state == txIdle:
		t.rollback(rt, tx, r.Context())
		rt.record(r, req, fence, leaseEnd, rm, outcomeComplete, rec.response(rt.replayHeaders))
	case status == http.StatusTooManyRequests:
		t.rollback(rt, tx, r.Context())
		rt.record(r, req, fence, once, rm, outcomeRelease, Response{})
	case status >= 500:
		t.rollback(rt, tx, r.Context())
		rt.record(r, req, fence, once, rm, t.failed(rt), Response{})
	case state == txAborted:
		t.rollback(rt, tx, r.Context())
		rt.record(r, req, fence, leaseEnd, rm, outcomeComplete, rec.response(rt.replayHeaders))
	default:
		if err := t.commit(rt, r.Context(), tx, fence, rec.response(rt.replayHeaders)); err != nil {
			t.answerUncommitted(rt, w, r, req, rm, before, err)
			return
		}
	}
	rec.finish()
}

// answerUncommitted answers instead of the handler when its writes and
// record could not be committed.
func (t *txRunner) answerUncommitted(rt *route, w http.ResponseWriter, r *http.Request, req ClaimRequest, rm *routeMetrics,
	before http.Header, err error) {
	m := rt.m
	switch {
	case errors.Is(err, ErrNotOwner):
		// The key was reclaimed while this handler ran: its writes rolled
		// back, and the client gets what any duplicate would.
		m.log.Warn("idempotency: key reclaimed while its handler ran; writes rolled back",
			"endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key)
		restoreHeader(w.Header(), before)
		t.answerAsLoser(rt, w, r, req, rm)
	default:
		m.log.Error("idempotency: commit failed; the key is reclaimable after its lease",
			"endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key, "reason", storeReason(err), "error", err)
		rm.recordFailures.Inc()
		restoreHeader(w.Header(), before)
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
