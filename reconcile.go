package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
	"unicode/utf8"
)

// Reconcile (docs/reconcile.md): a request that finds its key in flight
// past its lease, on a route with RouteConfig.Reconcile, takes a fenced
// reconcile claim on the row (Store.ClaimStale: one reconciler at a time)
// and asks the hook what became of the first call downstream. Done: the
// row completes with the hook's result, which the request gets as a
// replay. Not done: the handler runs under the reconcile claim. Unknown
// (an error, the hook's deadline): the reconcile claim's lease ends and
// the request gets 409 idempotency_outcome_unknown, as without a hook.

// ReconcileInfo is the stale key a Reconcile hook asks the downstream about.
type ReconcileInfo struct {
	Key, Scope, Endpoint, RequestHash string    // as ReplayEvent names them
	Attempt                           int32     // the reconcile claim's: the stale owner's plus one
	ClaimedAt                         time.Time // when the key was claimed
}

// validateReconcile checks RouteConfig.Reconcile and ReconcileTimeout
// under a middleware's lease and store timeout.
func (rc *RouteConfig) validateReconcile(lease, storeTimeout time.Duration) error {
	wait := rc.ReconcileTimeout
	if wait == 0 {
		wait = storeTimeout
	}
	switch {
	case rc.ReconcileTimeout < 0:
		return fmt.Errorf("idempotency: RouteConfig.ReconcileTimeout must be positive, got %v", rc.ReconcileTimeout)
	case rc.Reconcile == nil && rc.ReconcileTimeout != 0:
		return errors.New("idempotency: RouteConfig.ReconcileTimeout needs RouteConfig.Reconcile")
	case rc.Reconcile != nil && rc.NoStore:
		return errors.New("idempotency: RouteConfig.Reconcile cannot be combined with NoStore, which records no result")
	case rc.Reconcile != nil && wait >= lease-storeTimeout:
		return fmt.Errorf("idempotency: RouteConfig.ReconcileTimeout (%v) must be below Config.Lease less Config.StoreTimeout (%v)",
			wait, lease-storeTimeout)
	}
	return nil
}

// Reconcile outcomes: the metric's label values, and the log's.
const (
	reconcileDone    = "done"
	reconcileNotDone = "not_done"
	reconcileUnknown = "unknown"
)

// Store-call operations of reconcile.
const (
	opReconcile = "reconcile" // Store.ClaimStale
	opStale     = "stale"     // Store.Stale
)

// reconcile answers a request whose key is in flight past its lease on a
// route with a hook, and reports false when the route has none (the
// caller answers outcome unknown). It reconciles once per request.
func (rq *request) reconcile(rec Record) bool {
	if rq.policy.reconcile == nil || rq.reconciled {
		return false
	}
	rq.reconciled = true
	start := time.Now()
	own, ok := rq.claimStale(rec)
	if !ok {
		return true
	}
	v, kind, _ := rq.askReconcile(rq.t.auditContext(), own, start)
	var resp Response
	if kind == reconcileDone {
		var err error
		if resp, err = rq.t.reconciled(v); err != nil {
			kind = rq.reconcileRefused(own, err)
		}
	}
	switch kind {
	case reconcileDone:
		rq.settle(own, outcomeComplete, resp, start.Add(rq.m.cfg.Lease))
		if rq.recordFailed {
			rq.answer(answerUnavailable) // the reconcile claim's lease runs out; a later retry reconciles again
			return true
		}
		own.Status, own.Response = StatusCompleted, resp
		rq.replay(own)
	case reconcileNotDone:
		rq.runNotDone(own, start)
	default:
		rq.endOwnLease(own.Fence(), "") // logged as the reconcile's outcome
		rq.answer(answerOutcomeUnknown)
	}
	return true
}

// claimStale takes the reconcile claim on the stale row rec: false when
// it answered instead (another reconciler holds the key: 409 in flight;
// the store failed: 503).
func (rq *request) claimStale(rec Record) (Record, bool) {
	res, err := rq.storeClaim(opReconcile, func(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
		return reconcilerOf(rq.m.store).ClaimStale(ctx, rec.Fence(), req)
	})
	switch {
	case err != nil:
		rq.logClaimFailure(slog.LevelWarn, "idempotency: the reconcile claim failed, rejecting", storeReason(err), err)
		rq.cause = err
		rq.answer(answerUnavailable)
		return Record{}, false
	case !res.Won:
		rq.answer(answerInFlight) // another request reconciles the key now
		return Record{}, false
	}
	return res.Record, true
}

// runNotDone runs the handler for a key the hook found no trace of: under
// the reconcile claim on an ordinary route; on a transactional one, whose
// claim must be made in the handler's transaction, the key is released
// and claimed again.
func (rq *request) runNotDone(own Record, start time.Time) {
	if rq.policy.txStore == nil {
		rq.execute(own, start, nil)
		return
	}
	rq.settle(own, outcomeRelease, Response{}, start.Add(rq.m.cfg.Lease))
	if rq.recordFailed {
		rq.answer(answerUnavailable)
		return
	}
	rq.serve()
}

// reconcileRefused logs a done result that cannot be recorded, which
// counts as unknown.
func (rq *request) reconcileRefused(own Record, err error) string {
	rq.m.log.ErrorContext(rq.ctx, "idempotency: the reconcile hook's result cannot be recorded; the outcome stays unknown",
		"endpoint", own.Endpoint, "scope", own.Scope, "key", own.Key, "error", err)
	return reconcileUnknown
}

// askReconcile calls the route's hook for own, the reconcile claim,
// bounded by the ReconcileTimeout even when the hook ignores its context,
// then logs and observes it. base is the context the hook's derives from
// (detached from the caller's cancellation); start is when the reconcile
// began. The kind is done, not done or unknown; an error is unknown.
func (rq *request) askReconcile(base context.Context, own Record, start time.Time) (any, string, error) {
	ctx := rq.withKey(context.WithoutCancel(base), own) // downstream.Key works inside the hook
	ctx, cancel := context.WithTimeout(ctx, rq.policy.reconcileWait)
	defer cancel()
	info := ReconcileInfo{Key: own.Key, Scope: own.Scope, Endpoint: own.Endpoint, RequestHash: own.RequestHash,
		Attempt: own.Attempt, ClaimedAt: own.CreatedAt}
	type answer struct {
		v   any
		err error
	}
	ch := make(chan answer, 1) // a hook that returns after its deadline does not leak
	go func() {
		defer func() {
			if p := recover(); p != nil {
				ch <- answer{err: fmt.Errorf("idempotency: the reconcile hook panicked: %v", p)}
			}
		}()
		v, err := rq.policy.reconcile(ctx, info)
		ch <- answer{v, err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-ctx.Done():
		a.err = fmt.Errorf("idempotency: the reconcile hook did not return within ReconcileTimeout (%v): %w", rq.policy.reconcileWait, ctx.Err())
	}
	kind := reconcileDone
	switch {
	case errors.Is(a.err, ErrNotDone):
		kind = reconcileNotDone
	case a.err != nil:
		kind = reconcileUnknown
	}
	rq.logReconcile(own, kind, time.Since(start), a.err)
	return a.v, kind, a.err
}

// logReconcile logs and counts one reconcile: INFO for done and not
// done, WARN for unknown, with its error.
func (rq *request) logReconcile(own Record, kind string, took time.Duration, err error) {
	rq.m.metrics.reconcile.WithLabelValues(rq.label, kind).Observe(took.Seconds())
	level, args := slog.LevelInfo, []any{"endpoint", own.Endpoint, "scope", own.Scope, "key", own.Key,
		"attempt", own.Attempt, "outcome", kind, "duration", took}
	if kind == reconcileUnknown {
		level, args = slog.LevelWarn, append(args, "error", err)
	}
	rq.m.log.Log(rq.ctx, level, "idempotency: reconciled a stale key", args...)
}

// reconciledHTTP is a done hook's value as an HTTP route records it: a
// Response (or *Response) whose status completes a key (below 500, not
// 429), its headers kept by the route's allow-list, its body stored as
// JSON when its Content-Type says JSON and it is.
func reconciledHTTP(v any, allow []string) (Response, error) {
	var resp Response
	switch r := v.(type) {
	case Response:
		resp = r
	case *Response:
		if r == nil {
			return Response{}, errors.New("the hook returned a nil *Response")
		}
		resp = *r
	default:
		return Response{}, fmt.Errorf("an HTTP route's hook must return an idempotency.Response, not %T", v)
	}
	if resp.Status < 100 || resp.Status >= 500 || resp.Status == statusTooManyRequests {
		return Response{}, fmt.Errorf("status %d does not complete a key", resp.Status)
	}
	out := Response{Status: resp.Status, Body: resp.Body, BodyKind: BodyRaw}
	for _, name := range allow {
		if vs, ok := resp.Header[name]; ok {
			if out.Header == nil {
				out.Header = http.Header{}
			}
			out.Header[name] = append([]string(nil), vs...)
		}
	}
	if len(out.Body) > 0 && isJSONType(out.Header.Get("Content-Type")) && out.Header.Get("Content-Encoding") == "" &&
		utf8.Valid(out.Body) && json.Valid(out.Body) {
		out.BodyKind = BodyJSON
	}
	if out.Body == nil {
		out.Body = []byte{}
	}
	return out, nil
}

// reconciledValue is a done hook's value as an Operation records it: a
// Response as it is (an RPC adapter's, built with idemrpc.Record), any
// other value encoded as Do encodes its function's result.
func reconciledValue(v any, codec Codec, kind BodyKind) (Response, error) {
	if resp, ok := v.(Response); ok {
		return resp, nil
	}
	body, err := codec.Marshal(v)
	if err != nil {
		return Response{}, fmt.Errorf("the hook's value does not encode: %w", err)
	}
	return Response{Status: 200, Body: body, BodyKind: kind}, nil
}
