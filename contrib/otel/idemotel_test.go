package idemotel_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idempotency"
	idemotel "github.com/idemkit/idempotency/contrib/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

const key = "3f0b7c6e-2a4d-4e8f-9b1a-0c2d3e4f5a6b"

// fixture is a middleware reporting to in-memory OTel exporters, behind a
// handler that starts each request's span, as otelhttp would.
type fixture struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	srv    http.Handler
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	obs, err := idemotel.New(idemotel.Config{MeterProvider: mp, SpanScope: true})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		Observer: obs,
		Scope: func(ctx context.Context) string {
			r, _ := idempotency.RequestFromContext(ctx)
			return r.Header.Get("X-User")
		},
		IdentifierSecret: []byte("0123456789abcdef"),
		Enabled:          func(context.Context) bool { return true },
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	route := mw.MustRoute(idempotency.RouteConfig{Name: "POST /orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		_, _ = io.WriteString(w, `{"id":1}`)
	}))
	tracer := tp.Tracer("test")
	f.srv = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), "POST /orders")
		defer span.End()
		route.ServeHTTP(w, r.WithContext(ctx))
	})
	return f
}

func (f *fixture) send(t *testing.T, k, body string) int {
	t.Helper()
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
	r.Header.Set(idempotency.HeaderKey, k)
	r.Header.Set("X-User", "42")
	w := httptest.NewRecorder()
	f.srv.ServeHTTP(w, r)
	return w.Code
}

func TestSpansAndMetrics(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, c := range []struct {
		key, body string
		status    int
	}{{key, `{"a":1}`, 201}, {key, `{"a":1}`, 201}, {key, `{"a":2}`, 422}, {"bad", `{}`, 400}} {
		if got := f.send(t, c.key, c.body); got != c.status {
			t.Fatalf("key %s body %s: %d, want %d", c.key, c.body, got, c.status)
		}
	}

	spans := f.spans.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4", len(spans))
	}
	want := []struct {
		outcome, reason, event string
		status                 int64
	}{
		{"executed", "completed", "idempotency.executed", 201},
		{"replayed", "", "idempotency.replayed", 201},
		{"conflict", "body_mismatch", "idempotency.conflict", 422},
		{"rejected", "invalid_key", "idempotency.rejected", 400},
	}
	for i, s := range spans {
		attrs := attribute.NewSet(s.Attributes()...)
		get := func(k attribute.Key) attribute.Value { v, _ := attrs.Value(k); return v }
		if get(idemotel.AttrOutcome).AsString() != want[i].outcome || get(idemotel.AttrReason).AsString() != want[i].reason ||
			get(idemotel.AttrEndpoint).AsString() != "POST /orders" || get(idemotel.AttrStatus).AsInt64() != want[i].status {
			t.Errorf("span %d attributes %v, want %+v", i, s.Attributes(), want[i])
		}
		if len(s.Events()) != 1 || s.Events()[0].Name != want[i].event {
			t.Errorf("span %d events %+v, want one %s", i, s.Events(), want[i].event)
		}
		// The scope is on the span only as its HMAC, never the user id.
		if sc := get(idemotel.AttrScope).AsString(); i < 3 && (len(sc) != 64 || sc == "42") {
			t.Errorf("span %d scope %q, want a 64-hex HMAC", i, sc)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	var durations uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					reason, _ := p.Attributes.Value("reason")
					ep, _ := p.Attributes.Value("endpoint")
					if ep.AsString() != "POST /orders" {
						t.Errorf("%s: endpoint %q", m.Name, ep.AsString())
					}
					counts[m.Name+"/"+reason.AsString()] += p.Value
				}
			case metricdata.Histogram[float64]:
				if m.Name == "idempotency.request.duration" {
					for _, p := range d.DataPoints {
						durations += p.Count
					}
				}
			}
		}
	}
	wantCounts := map[string]int64{
		"idempotency.miss/": 1, "idempotency.hit/": 2, "idempotency.replay/": 1,
		"idempotency.conflicts/body_mismatch": 1, "idempotency.rejections/invalid_key": 1,
	}
	for k, v := range wantCounts {
		if counts[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, counts[k], v, counts)
		}
	}
	if len(counts) != len(wantCounts) || durations != 4 {
		t.Errorf("counters %v, %d durations; want only %v and 4", counts, durations, wantCounts)
	}
}

// saturated is a store whose every claim finds the pool exhausted.
type saturated struct{ *idempotency.MemoryStore }

func (saturated) Claim(context.Context, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{}, &idempotency.StoreError{Op: "claim", Reason: idempotency.ReasonPoolExhausted, Err: errors.New("every connection in use")}
}

// TestStoreErrorsMirrored: a claim that failed with a store error counts as
// a store_unavailable rejection and under its store-error reason, as
// idempotency_rejections_total and idempotency_store_errors_total do, and
// the span's event names the reason.
func TestStoreErrorsMirrored(t *testing.T) {
	t.Parallel()
	spans, reader := tracetest.NewSpanRecorder(), sdkmetric.NewManualReader()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	obs, err := idemotel.New(idemotel.Config{MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.New(saturated{idempotency.NewMemoryStore()}, idempotency.Config{Observer: obs,
		Enabled: func(context.Context) bool { return true }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	route := mw.MustRoute(idempotency.RouteConfig{Name: "POST /billing", FailOpen: true})(http.NotFoundHandler())
	r := httptest.NewRequest("POST", "/billing", strings.NewReader(`{}`))
	r.Header.Set(idempotency.HeaderKey, key)
	ctx, span := tp.Tracer("test").Start(r.Context(), "POST /billing")
	w := httptest.NewRecorder()
	route.ServeHTTP(w, r.WithContext(ctx))
	span.End()
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("saturated fail-open route: %d, want 503", w.Code)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range d.DataPoints {
					reason, _ := p.Attributes.Value("reason")
					counts[m.Name+"/"+reason.AsString()] += p.Value
				}
			}
		}
	}
	if counts["idempotency.rejections/store_unavailable"] != 1 || counts["idempotency.store_errors/pool_exhausted"] != 1 ||
		counts["idempotency.bypasses/store_unavailable"] != 0 {
		t.Errorf("counters %v, want one store_unavailable rejection and one pool_exhausted store error", counts)
	}
	ev := spans.Ended()[0].Events()
	if len(ev) != 1 || !slices.Contains(ev[0].Attributes, idemotel.AttrStoreReason.String("pool_exhausted")) {
		t.Errorf("span events %+v, want one naming the store reason", ev)
	}
}
