package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// ReconcileStale runs rc.Reconcile for at most limit stale keys of
// endpoint (a route's name, an Operation's do:<name>), for a job; not done
// releases the key (docs/reconcile.md).
func (m *Middleware) ReconcileStale(ctx context.Context, endpoint string, rc RouteConfig, limit int) (done, released, unknown int, err error) {
	rc = rc.withDefaults()
	p, err := m.newPolicy(rc)
	switch {
	case err != nil:
		return 0, 0, 0, err
	case p.reconcile == nil:
		return 0, 0, 0, errors.New("idempotency: ReconcileStale needs a RouteConfig with Reconcile")
	case limit < 1:
		return 0, 0, 0, errors.New("idempotency: ReconcileStale's limit must be at least 1")
	}
	record, err := staleRecorder(endpoint, rc)
	if err != nil {
		return 0, 0, 0, err
	}
	recs, err := timedCall(m, ctx, opStale, func(ctx context.Context) ([]Record, error) {
		return reconcilerOf(m.store).Stale(ctx, endpoint, limit)
	})
	for _, rec := range recs {
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			break
		}
		rq := &request{policy: &p, m: m, ctx: ctx, adapter: "job", endpoint: endpoint, label: endpoint, rm: m.metricsFor(endpoint),
			claim: ClaimRequest{Key: rec.Key, Scope: rec.Scope, Endpoint: rec.Endpoint, RequestHash: rec.RequestHash,
				TTL: p.ttl, Lease: m.cfg.Lease, Owner: uuid.New()}}
		var kind string
		switch kind, err = rq.reconcileStale(rec, record); kind {
		case reconcileDone:
			done++
		case reconcileNotDone:
			released++
		case reconcileUnknown:
			unknown++
		}
	}
	return done, released, unknown, err
}

// staleRecorder returns how ReconcileStale records a done value for
// endpoint: an Operation's as Do encodes it, a route's as a Response.
func staleRecorder(endpoint string, rc RouteConfig) (func(any) (Response, error), error) {
	if reservedName(endpoint) {
		codec, kind := (&Operation{codec: rc.Codec}).codecOf()
		return func(v any) (Response, error) { return reconciledValue(v, codec, kind) }, nil
	}
	allow, err := replayAllowList(rc.ReplayHeaders)
	if err != nil {
		return nil, err
	}
	return func(v any) (Response, error) { return reconciledHTTP(v, allow) }, nil
}

// reconcileStale reconciles the stale row rec without a request: its
// outcome ("" when another reconciler holds the key), or the store's
// error.
func (rq *request) reconcileStale(rec Record, record func(any) (Response, error)) (string, error) {
	start := time.Now()
	res, err := storeCall(rq, opReconcile, func(ctx context.Context) (ClaimResult, error) {
		return reconcilerOf(rq.m.store).ClaimStale(ctx, rec.Fence(), rq.claim)
	})
	if err != nil || !res.Won {
		return "", err
	}
	own := res.Record
	v, kind, _ := rq.askReconcile(rq.ctx, own, start)
	var resp Response
	if kind == reconcileDone {
		if resp, err = record(v); err != nil {
			kind = rq.reconcileRefused(own, err)
		}
	}
	switch kind {
	case reconcileDone:
		rq.settle(own, outcomeComplete, resp, start.Add(rq.m.cfg.Lease))
	case reconcileNotDone:
		rq.settle(own, outcomeRelease, Response{}, start.Add(rq.m.cfg.Lease))
	default:
		rq.endOwnLease(own.Fence(), "")
	}
	if rq.recordFailed {
		return reconcileUnknown, nil
	}
	return kind, nil
}
