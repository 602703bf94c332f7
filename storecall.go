package idempotency

// Every store call goes through here: its own deadline, detached from the
// caller where a request makes it, and its duration and errors counted.

import (
	"context"
	"errors"
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
	if err != nil && !errors.Is(err, ErrNotOwner) {
		m.metrics.storeErrors.WithLabelValues(op, storeReason(err)).Inc()
	}
	return v, took, err
}
