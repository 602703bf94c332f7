// Package idemotel reports the idempotency middleware's decisions to
// OpenTelemetry: span attributes and an event on the request's span, and
// OTel metrics mirroring the per-request rows of the middleware's
// Prometheus table.
//
// Wire its Observer into idempotency.Config and run the middleware inside
// an OpenTelemetry HTTP handler (otelhttp), so the request's context
// carries the span:
//
//	obs, err := idemotel.New(idemotel.Config{})
//	mw, err := idempotency.New(store, idempotency.Config{Observer: obs})
//
// It lives in its own module so the root module never depends on
// OpenTelemetry.
package idemotel

import (
	"context"
	"errors"

	"github.com/idemkit/idempotency"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/idemkit/idempotency/contrib/otel"

// Span attribute keys set on the request's span.
const (
	AttrOutcome  = attribute.Key("idempotency.outcome")  // pass_through, bypassed, executed, replayed, conflict, rejected
	AttrReason   = attribute.Key("idempotency.reason")   // the outcome's reason, when it has one
	AttrEndpoint = attribute.Key("idempotency.endpoint") // the route's name or pattern, never a raw path
	AttrStatus   = attribute.Key("idempotency.status")   // the status sent, when known
	AttrScope    = attribute.Key("idempotency.scope")    // only with Config.SpanScope
	// AttrStoreReason is the store error's reason (pool_exhausted, timeout,
	// ...) of a request whose claim failed.
	AttrStoreReason = attribute.Key("idempotency.store_reason")
)

// Config configures the Observer. The zero value is usable.
type Config struct {
	// MeterProvider provides the meter. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// SpanScope adds the Observation's scope to the span as
	// idempotency.scope. Set idempotency.Config.IdentifierSecret with it,
	// so spans carry the scope's HMAC, never the user id. Metrics never
	// carry it. Defaults to false.
	SpanScope bool
}

// instruments are the metrics, named after the Prometheus table's
// (idempotency_miss_total becomes idempotency.miss, with the same
// endpoint and reason attributes).
type instruments struct {
	miss, hit, replay, conflicts, rejections, bypasses, recordFailures, tooLarge, storeErrors metric.Int64Counter
	duration, storeDuration                                                                   metric.Float64Histogram
}

// New returns an Observer for idempotency.Config.Observer.
func New(cfg Config) (func(context.Context, idempotency.Observation), error) {
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName)
	var ins instruments
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{request}"))
		errs = append(errs, err)
		return c
	}
	ins.miss = counter("idempotency.miss", "Requests that claimed their key.")
	ins.hit = counter("idempotency.hit", "Requests that found a live row for their key.")
	ins.replay = counter("idempotency.replay", "Stored responses served.")
	ins.conflicts = counter("idempotency.conflicts", "409 and 422 answers, by reason.")
	ins.rejections = counter("idempotency.rejections", "4xx and 503 answers without a usable result, by reason.")
	ins.bypasses = counter("idempotency.bypasses", "Requests whose handler ran without deduplication, by reason.")
	ins.recordFailures = counter("idempotency.record_failures", "Responses that could not be recorded.")
	ins.tooLarge = counter("idempotency.response_too_large", "Transactional responses over the buffer cap.")
	ins.storeErrors = counter("idempotency.store_errors", "Requests whose claim failed with a store error (503 or bypass), by the store error's reason.")
	var err error
	ins.duration, err = meter.Float64Histogram("idempotency.request.duration", metric.WithUnit("s"),
		metric.WithDescription("From a request's arrival to its decision; for executed requests, to the end of the response."))
	errs = append(errs, err)
	ins.storeDuration, err = meter.Float64Histogram("idempotency.request.store_duration", metric.WithUnit("s"),
		metric.WithDescription("Time a request spent in store calls."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return func(ctx context.Context, o idempotency.Observation) {
		ins.record(ctx, o)
		annotate(trace.SpanFromContext(ctx), o, cfg.SpanScope)
	}, nil
}

// record counts o as the Prometheus collectors count the same request.
func (ins *instruments) record(ctx context.Context, o idempotency.Observation) {
	ep := attribute.String("endpoint", o.Endpoint)
	byEndpoint := metric.WithAttributeSet(attribute.NewSet(ep))
	byReason := metric.WithAttributeSet(attribute.NewSet(ep, attribute.String("reason", o.Reason)))
	// Hit and Miss say how the claim counted: the outcome alone cannot (a
	// 503 may follow a won claim, a live row or no claim at all).
	if o.Miss {
		ins.miss.Add(ctx, 1, byEndpoint)
	}
	if o.Hit {
		ins.hit.Add(ctx, 1, byEndpoint)
	}
	switch o.Outcome {
	case idempotency.OutcomeExecuted:
		if o.Reason == "response_too_large" {
			ins.tooLarge.Add(ctx, 1, byEndpoint)
		}
	case idempotency.OutcomeReplayed:
		ins.replay.Add(ctx, 1, byEndpoint)
	case idempotency.OutcomeConflict:
		ins.conflicts.Add(ctx, 1, byReason)
	case idempotency.OutcomeRejected:
		ins.rejections.Add(ctx, 1, byReason)
	case idempotency.OutcomeBypassed:
		ins.bypasses.Add(ctx, 1, byReason)
	}
	if o.RecordFailed {
		ins.recordFailures.Add(ctx, 1, byEndpoint)
	}
	if o.StoreReason != "" {
		ins.storeErrors.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(ep, attribute.String("reason", o.StoreReason))))
	}
	byOutcome := metric.WithAttributeSet(attribute.NewSet(ep, attribute.String("outcome", string(o.Outcome))))
	ins.duration.Record(ctx, o.Duration.Seconds(), byOutcome)
	if o.StoreDuration > 0 {
		ins.storeDuration.Record(ctx, o.StoreDuration.Seconds(), byEndpoint)
	}
}

// annotate sets the decision's attributes on span and adds an event named
// for the outcome (idempotency.replayed, idempotency.conflict, ...).
func annotate(span trace.Span, o idempotency.Observation, withScope bool) {
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, AttrOutcome.String(string(o.Outcome)), AttrEndpoint.String(o.Endpoint))
	if o.Reason != "" {
		attrs = append(attrs, AttrReason.String(o.Reason))
	}
	if o.Status != 0 {
		attrs = append(attrs, AttrStatus.Int(o.Status))
	}
	if withScope && o.Scope != "" {
		attrs = append(attrs, AttrScope.String(o.Scope))
	}
	span.SetAttributes(attrs...)
	event := []attribute.KeyValue{attribute.Float64("idempotency.store_duration_s", o.StoreDuration.Seconds())}
	if o.Reason != "" {
		event = append(event, AttrReason.String(o.Reason))
	}
	if o.StoreReason != "" {
		event = append(event, AttrStoreReason.String(o.StoreReason))
	}
	if o.RecordFailed {
		event = append(event, attribute.Bool("idempotency.record_failed", true))
	}
	span.AddEvent("idempotency."+string(o.Outcome), trace.WithAttributes(event...))
}
