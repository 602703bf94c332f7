package idempotency

// The heartbeat of a RouteConfig.Heartbeat run: the claim's lease is
// renewed while its handler runs, so the handler may run until MaxRun, and
// the handler is cancelled the moment its record could no longer land
// inside a lease it holds.

import (
	"context"
	"errors"
	"sync"
	"time"
)

// opRenew is the store operation label of a renewal.
const opRenew = "renew"

// Why a heartbeat lost its lease: the reason of its log line.
const (
	leaseTaken   = "not_owner"      // a renewal found the row no longer owned (taken over, erased, released)
	leaseRunsOut = "renewal_failed" // no renewal succeeded in time for the record to fit in the lease
)

// heartbeat renews an owned run's lease every third of it, fenced by the
// claim's id, attempt and owner token (Store.Renew), from the handler's
// start until it returns. It cancels the handler's context, with
// ErrLeaseLost as the cause, when a renewal finds the key no longer owned,
// or when no renewal has succeeded by the last confirmed lease end less
// the store timeout: a lease counts from when its renewal (or the claim)
// was sent, on this process's clock, so the record still fits in it.
type heartbeat struct {
	x      *execution
	cancel context.CancelCauseFunc // the handler's context
	stop   chan struct{}           // closed when the handler returned
	done   chan struct{}           // closed when the renewals ended

	mu     sync.Mutex
	until  time.Time   // the last confirmed lease end
	expire *time.Timer // fires at until less the store timeout
	lost   string      // why the lease was lost; "" while it holds
	err    error       // the last renewal's error
}

// startHeartbeat starts renewing x's lease, which ends at x.leaseEnd, for
// the handler whose context cancel cancels.
func (x *execution) startHeartbeat(cancel context.CancelCauseFunc) {
	h := &heartbeat{x: x, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{}), until: x.leaseEnd}
	h.mu.Lock()
	h.expire = time.AfterFunc(time.Until(h.deadline()), func() { h.lose(leaseRunsOut, nil) })
	h.mu.Unlock()
	x.hb = h
	go h.run()
}

// deadline is when the handler must have returned for its record to fit
// in the confirmed lease. h.mu must be held.
func (h *heartbeat) deadline() time.Time { return h.until.Add(-h.x.m.cfg.StoreTimeout) }

// run renews the lease every third of it until the handler returns or the
// lease is lost. A renewal that fails with a store error is tried again a
// third of the lease later: the expiry timer decides when to give up.
func (h *heartbeat) run() {
	defer close(h.done)
	lease := h.x.m.cfg.Lease
	tick := time.NewTimer(lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-tick.C:
		}
		sent := time.Now()
		_, err := timedCall(h.x.m, context.WithoutCancel(h.x.ctx), opRenew, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, h.x.m.store.Renew(ctx, h.x.fence, h.x.claim)
		})
		switch {
		case err == nil:
			h.renewed(sent.Add(lease))
		case errors.Is(err, ErrNotOwner):
			h.lose(leaseTaken, err)
			return
		default:
			h.mu.Lock()
			h.err = err
			h.mu.Unlock()
			h.x.m.log.WarnContext(h.x.ctx, "idempotency: could not renew the lease of a running handler; trying again",
				"endpoint", h.x.claim.Endpoint, "scope", h.x.claim.Scope, "key", h.x.claim.Key, "reason", storeReason(err), "error", err)
		}
		tick.Reset(time.Until(sent.Add(lease / 3)))
	}
}

// renewed confirms the lease up to until.
func (h *heartbeat) renewed(until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost != "" || !until.After(h.until) {
		return
	}
	h.until = until
	select {
	case <-h.stop: // the handler returned: the timer stays stopped
	default:
		h.expire.Reset(time.Until(h.deadline()))
	}
}

// lose marks the lease lost for reason and cancels the handler, unless it
// was lost already or, when its time ran out, a renewal came in meanwhile.
func (h *heartbeat) lose(reason string, err error) {
	h.mu.Lock()
	if h.lost != "" || reason == leaseRunsOut && time.Now().Before(h.deadline()) {
		h.mu.Unlock()
		return
	}
	h.lost = reason
	err = cmpErr(err, h.err)
	h.mu.Unlock()
	h.cancel(ErrLeaseLost)
	args := []any{"endpoint", h.x.claim.Endpoint, "scope", h.x.claim.Scope, "key", h.x.claim.Key, "reason", reason}
	if err != nil {
		args = append(args, "error", err)
	}
	h.x.m.log.ErrorContext(h.x.ctx, "idempotency: a running handler lost its key's lease; it is cancelled, nothing is recorded, the client gets 503", args...)
}

// cmpErr returns the first non-nil error.
func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// end stops the renewals once the handler returned, waiting for one under
// way, and returns the confirmed lease end, which bounds the record, and
// whether the lease was lost (also when the handler returned past its
// deadline).
func (h *heartbeat) end() (until time.Time, lost bool) {
	close(h.stop)
	<-h.done
	h.mu.Lock()
	h.expire.Stop()
	late := h.lost == "" && !time.Now().Before(h.deadline())
	h.mu.Unlock()
	if late {
		h.lose(leaseRunsOut, nil)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.until, h.lost != ""
}
