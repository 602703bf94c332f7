package idempotency

// Every store call goes through here: its own deadline, detached from the
// caller where a request makes it, and its duration and errors counted.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// storeCall runs one store operation of a request under its own deadline,
// detached from the client's connection, and records its duration (in the
// metrics and the request's store time) and any error.
func storeCall[T any](rq *request, op string, fn func(context.Context) (T, error)) (T, error) {
	v, took, err := timeCall(rq.m, context.WithoutCancel(rq.ctx), op, fn)
	rq.storeTime += took
	return v, err
}

// timedCall runs one store operation under ctx and the store timeout, and
// records its duration and any error. Cleanup and Erase use it directly:
// their caller's cancellation and deadline apply too.
func timedCall[T any](m *Middleware, ctx context.Context, op string, fn func(context.Context) (T, error)) (T, error) {
	v, _, err := timeCall(m, ctx, op, fn)
	return v, err
}

// timeCall is timedCall, also returning how long the operation took.
func timeCall[T any](m *Middleware, ctx context.Context, op string, fn func(context.Context) (T, error)) (T, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	start := time.Now()
	v, err := fn(ctx)
	cancel()
	took := time.Since(start)
	m.ops[op].Observe(took.Seconds())
	if err == nil || errors.Is(err, ErrNotOwner) {
		if op != opProbe { // the probe's new connection says nothing of the pool's calls
			m.metrics.health.answered(ctx, m.log)
		}
		return v, took, err
	}
	reason := storeReason(err)
	m.metrics.storeErrors.WithLabelValues(op, reason).Inc()
	switch {
	case reason == ReasonConflict, reason == ReasonData, reason == ReasonUnseal: // the store answered those
	case reason == ReasonSeal: // the key source failed, before the store was asked
	case op == opProbe: // the claim it followed was counted already
	default:
		m.metrics.health.failed()
	}
	return v, took, err
}

// storeHealth counts the store's failing calls since it last answered, so
// that the first answer after them logs one INFO line saying how many
// there were and for how long.
type storeHealth struct {
	failing  atomic.Bool // read by every answered call: the cheap path
	mu       sync.Mutex
	failures int64
	since    time.Time // the first failure's time
}

func (h *storeHealth) failed() {
	h.mu.Lock()
	if h.failures == 0 {
		h.since = time.Now()
	}
	h.failures++
	h.failing.Store(true)
	h.mu.Unlock()
}

// answered ends a run of failures, logging it once.
func (h *storeHealth) answered(ctx context.Context, log *slog.Logger) {
	if !h.failing.Load() {
		return
	}
	h.mu.Lock()
	n, since := h.failures, h.since
	h.failures = 0
	h.failing.Store(false)
	h.mu.Unlock()
	if n > 0 {
		log.InfoContext(ctx, "idempotency: the store recovered", "failures", n, "failed_for", time.Since(since).Round(time.Millisecond).String())
	}
}
