package idemotel_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	idemotel "github.com/idemkit/idempotency/contrib/otel"
	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// contentionStore fails every claim as contention: serialization failures
// past the store's retries.
type contentionStore struct{ *idempotency.MemoryStore }

func (contentionStore) Claim(context.Context, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{}, &idempotency.StoreError{Op: "claim", Reason: idempotency.ReasonConflict, Err: errors.New("could not serialize access")}
}

// lostRaceStore finds an expired row for every key and loses every
// takeover of it: others keep winning the key.
type lostRaceStore struct{ *idempotency.MemoryStore }

func (lostRaceStore) Claim(context.Context, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{Record: idempotency.Record{ID: 1, Attempt: 1, Status: idempotency.StatusCompleted, Expired: true}}, nil
}

func (lostRaceStore) Takeover(context.Context, idempotency.Fence, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{Lost: true}, nil
}

// slowClaimStore wins its first claim late: past the handler's deadline
// (the lease less the store timeout).
type slowClaimStore struct {
	*idempotency.MemoryStore
	slowed atomic.Bool
}

func (s *slowClaimStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, req)
	if s.slowed.CompareAndSwap(false, true) {
		time.Sleep(150 * time.Millisecond) // a slow reply, not synchronisation
	}
	return res, err
}

// TestMetricsMirrorPrometheus: for each way a request can go, the OTel
// counters (idempotency.miss, .hit, ...) equal the Prometheus counters of
// the same name, series by series. Found by a review: a replay refused
// because the replay hook failed, a claim lost to contention and a claim
// too slow to leave the handler time were counted differently.
func TestMetricsMirrorPrometheus(t *testing.T) {
	t.Parallel()
	hookFails := func(context.Context, idempotency.ReplayEvent) error { return errors.New("audit log down") }
	for _, c := range []struct {
		name  string
		store idempotency.Store
		cfg   idempotency.Config
		rc    idempotency.RouteConfig
		sends int // requests with one key
	}{
		{name: "executed and replayed", sends: 2},
		{name: "replay hook failed, fail-closed", cfg: idempotency.Config{OnReplay: hookFails}, sends: 2},
		{name: "replay hook failed, fail-open", cfg: idempotency.Config{OnReplay: hookFails}, rc: idempotency.RouteConfig{FailOpen: true}, sends: 2},
		{name: "claim failed as contention", store: contentionStore{idempotency.NewMemoryStore()}, sends: 1},
		{name: "claim failed as contention, fail-open", store: contentionStore{idempotency.NewMemoryStore()}, rc: idempotency.RouteConfig{FailOpen: true}, sends: 1},
		{name: "takeover lost every round", store: lostRaceStore{idempotency.NewMemoryStore()}, sends: 1},
		{name: "claim too slow for the handler", store: &slowClaimStore{MemoryStore: idempotency.NewMemoryStore()},
			cfg: idempotency.Config{Lease: 300 * time.Millisecond, StoreTimeout: 200 * time.Millisecond}, sends: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
			obs, err := idemotel.New(idemotel.Config{MeterProvider: mp})
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			cfg := c.cfg
			cfg.Observer, cfg.Registerer = obs, reg
			cfg.Enabled = func(context.Context) bool { return true }
			cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			store := c.store
			if store == nil {
				store = idempotency.NewMemoryStore()
			}
			mw, err := idempotency.New(store, cfg)
			if err != nil {
				t.Fatal(err)
			}
			rc := c.rc
			rc.Name = "POST /orders"
			h := mw.MustRoute(rc)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
			}))
			for range c.sends {
				r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
				r.Header.Set(idempotency.HeaderKey, key)
				h.ServeHTTP(httptest.NewRecorder(), r)
			}
			prom, otel := promCounts(t, reg), otelCounts(t, reader)
			if strings.Join(prom, "\n") != strings.Join(otel, "\n") {
				t.Errorf("Prometheus counted:\n\t%s\nOpenTelemetry counted:\n\t%s", strings.Join(prom, "\n\t"), strings.Join(otel, "\n\t"))
			}
		})
	}
}

// mirrored are the per-request counters contrib/otel mirrors.
var mirrored = []string{"miss", "hit", "replay", "conflicts", "rejections", "bypasses", "record_failures", "response_too_large"}

// promCounts lists the mirrored Prometheus series that counted anything,
// as "name{label=value,...} count", sorted.
func promCounts(t *testing.T, reg prometheus.Gatherer) []string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		name := strings.TrimSuffix(strings.TrimPrefix(f.GetName(), "idempotency_"), "_total")
		if !slices.Contains(mirrored, name) {
			continue
		}
		for _, m := range f.GetMetric() {
			if v := m.GetCounter().GetValue(); v > 0 {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				out = append(out, series(name, labels, int64(v)))
			}
		}
	}
	sort.Strings(out)
	return out
}

// otelCounts lists the OTel counters in promCounts' form.
func otelCounts(t *testing.T, reader *sdkmetric.ManualReader) []string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			name := strings.TrimPrefix(m.Name, "idempotency.")
			if !ok || !slices.Contains(mirrored, name) {
				continue
			}
			for _, p := range sum.DataPoints {
				if p.Value > 0 {
					var labels []string
					for _, kv := range p.Attributes.ToSlice() {
						labels = append(labels, string(kv.Key)+"="+kv.Value.String())
					}
					out = append(out, series(name, labels, p.Value))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func series(name string, labels []string, v int64) string {
	sort.Strings(labels)
	return name + "{" + strings.Join(labels, ",") + "} " + strconv.FormatInt(v, 10)
}
