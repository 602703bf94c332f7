package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
)

// Unsettled: a handler whose downstream call may or may not have taken
// effect (a timeout, a dropped connection, a 5xx of a broker) ends with
// it. Nothing is recorded; on an ordinary route the claim's lease ends at
// once (Store.EndLease), so the client's retry reconciles the key
// (reconcile.go) instead of waiting out the lease; a transactional route
// rolls everything back. The client gets 503 idempotency_store_unavailable
// with Retry-After: 1 either way.

// Unsettled, as an HTTP handler's last call, says its downstream outcome
// is unknown: nothing is recorded, the client gets 503 with Retry-After: 1,
// and its retry reconciles (docs/reconcile.md).
func Unsettled(w http.ResponseWriter, r *http.Request) {
	if m, ok := r.Context().Value(markCtxKey{}).(*handlerMark); ok {
		m.unsettled.Store(true)
		return
	}
	h := w.Header()
	h.Set("Retry-After", answers[answerUnavailable].retryAfter)
	h.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(`{"error":"` + answers[answerUnavailable].code + `"}`))
}

// markCtxKey is the context key of a run's handlerMark.
type markCtxKey struct{}

// handlerMark is what a run's handler tells the engine besides its
// result: that it ended Unsettled.
type handlerMark struct{ unsettled atomic.Bool }

// withMark returns ctx carrying a new mark for the run's handler.
func (x *execution) withMark(ctx context.Context) context.Context {
	x.mark = new(handlerMark)
	return context.WithValue(ctx, markCtxKey{}, x.mark)
}

// markUnsettled marks the run of ctx unsettled (an adapter's handler said
// so in its own terms), reporting whether ctx belongs to a run.
func markUnsettled(ctx context.Context) bool {
	m, ok := ctx.Value(markCtxKey{}).(*handlerMark)
	if ok {
		m.unsettled.Store(true)
	}
	return ok
}

// unsettled reports a handler that ended Unsettled.
func (x *execution) unsettled() bool { return x.mark != nil && x.mark.unsettled.Load() }

// unsettle answers a run whose handler ended Unsettled: nothing is
// recorded; an ordinary claim's lease ends now (the retry reconciles), a
// transactional run rolls back whole (the claim with it); 503.
func (x *execution) unsettle() {
	switch {
	case x.tx != nil:
		x.abort()
		x.m.log.WarnContext(x.ctx, "idempotency: the handler's downstream outcome is unknown (Unsettled); transaction rolled back",
			"endpoint", x.label, "scope", x.claim.Scope, "key", x.claim.Key)
	case x.owned:
		x.endOwnLease(x.fence, "idempotency: the handler's downstream outcome is unknown (Unsettled); lease ended, the retry reconciles")
	}
	if x.owned {
		x.observe(OutcomeExecuted, reasonUnsettled, answers[answerUnavailable].status)
	}
	x.cause = ErrUnsettled
	x.answer(answerUnavailable)
}

// reasonUnsettled is the Observation reason of a run that ended
// Unsettled.
const reasonUnsettled = "unsettled"

// endOwnLease ends the lease of the request's own claim f
// (Store.EndLease), logging msg at WARN when it did (unless msg is "").
// A lease that cannot be ended runs out by itself: until then the key
// answers 409 in flight.
func (rq *request) endOwnLease(f Fence, msg string) {
	_, err := storeCall(rq, "end_lease", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, reconcilerOf(rq.m.store).EndLease(ctx, f)
	})
	level, args := slog.LevelWarn, []any{"endpoint", rq.claim.Endpoint, "scope", rq.claim.Scope, "key", rq.claim.Key}
	switch {
	case errors.Is(err, ErrNotOwner):
		level, msg = slog.LevelError, "idempotency: could not end the lease: the key was taken over or finished meanwhile"
	case err != nil:
		level, msg = slog.LevelError, "idempotency: could not end the lease; the key answers in flight until it runs out"
		args = append(args, "reason", storeReason(err), "error", err)
	}
	if msg != "" {
		rq.m.log.Log(rq.ctx, level, msg, args...)
	}
}
