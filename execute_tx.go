package idempotency

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// The transactional difference of a run (README "Transactional
// routes"): the handler writes through a transaction of the route's
// TxStore, which commits together with the completed record, fenced on the
// claim's attempt. Nothing is sent before the commit.

// begin starts the run's transaction. When it cannot, a claimed key is
// given back (nothing ran) and the client gets 503.
func (x *execution) begin() bool {
	tx, err := storeCall(&x.request, "begin", x.rt.txStore.Begin)
	if err == nil {
		x.tx, x.before = tx, x.w.Header().Clone()
		return true
	}
	if x.owned {
		x.settle(x.fence, outcomeRelease, Response{}, time.Time{})
		x.m.log.WarnContext(x.r.Context(), "idempotency: cannot begin the route's transaction; key released",
			"endpoint", x.claim.Endpoint, "key", x.claim.Key, "error", err)
	} else {
		x.m.log.WarnContext(x.r.Context(), "idempotency: cannot begin the route's transaction", "endpoint", x.label, "error", err)
	}
	x.answer(answerUnavailable)
	return false
}

// abort rolls the run's transaction back, if it has one. A rollback that
// fails leaves nothing behind: the server rolls back when the connection
// goes.
func (x *execution) abort() {
	if x.tx == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.r.Context()), x.m.cfg.StoreTimeout)
	defer cancel()
	_ = x.tx.Abort(ctx)
}

// commit commits the handler's writes, with the completed record on an
// owned run. When it cannot, everything is rolled back and the client gets
// what a duplicate would (the key was reclaimed meanwhile) or 503.
func (x *execution) commit() bool {
	_, err := storeCall(&x.request, "commit", func(ctx context.Context) (struct{}, error) {
		if x.owned {
			return struct{}{}, x.tx.Commit(ctx, &Settlement{Fence: x.fence, Response: x.buf.response(x.rt.replayHeaders)})
		}
		return struct{}{}, x.tx.Commit(ctx, nil)
	})
	if err == nil {
		return true
	}
	x.abort()
	restoreHeader(x.w.Header(), x.before)
	switch {
	case x.owned && errors.Is(err, ErrNotOwner):
		// The key was reclaimed while this handler ran: its writes rolled
		// back, and the client gets what any duplicate would.
		x.m.log.WarnContext(x.r.Context(), "idempotency: key reclaimed while its handler ran; writes rolled back",
			"endpoint", x.claim.Endpoint, "scope", x.claim.Scope, "key", x.claim.Key)
		x.answerAsLoser()
	case x.owned:
		x.m.log.ErrorContext(x.r.Context(), "idempotency: commit failed; the key is reclaimable after its lease",
			"endpoint", x.claim.Endpoint, "scope", x.claim.Scope, "key", x.claim.Key, "reason", storeReason(err), "error", err)
		x.rm.settleFailures.Inc()
		x.recordFailed = true
		x.answer(answerUnavailable)
	default:
		x.m.log.ErrorContext(x.r.Context(), "idempotency: commit failed", "endpoint", x.label, "error", err)
		x.answer(answerUnavailable)
	}
	return false
}

// checkState reads how the handler left its transaction and logs what it
// must not do: end the transaction itself with SQL (its writes so far may
// have committed outside the key's fence), or answer success from an
// aborted transaction (its writes did not happen). The handler has
// returned, so nothing else uses the connection.
func (x *execution) checkState() TxState {
	state := x.tx.State()
	status := x.buf.statusCode()
	switch {
	case state == TxEnded:
		x.m.log.ErrorContext(x.r.Context(), "idempotency: the handler ended the route's transaction with SQL (COMMIT or ROLLBACK through Exec); "+
			"its writes escaped the key's fence", "endpoint", x.label, "scope", x.claim.Scope, "key", x.claim.Key, "status", status)
	case state == TxAborted && status < 400 && !x.buf.tooLarge:
		x.m.log.WarnContext(x.r.Context(), "idempotency: the handler answered success from an aborted transaction; its writes did not happen",
			"endpoint", x.label, "scope", x.claim.Scope, "key", x.claim.Key, "status", status)
	}
	return state
}

// answerTooLarge answers a transactional response over the buffer cap,
// whose writes were rolled back.
func (x *execution) answerTooLarge() {
	x.m.log.ErrorContext(x.r.Context(), "idempotency: response over the transactional route's buffer cap; writes rolled back",
		"endpoint", x.label, "cap_bytes", bufferCap(x.rt.maxResponse))
	restoreHeader(x.w.Header(), x.before)
	x.answer(answerResponseTooLarge)
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
