package idempotency

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// takenOverStore answers every Complete with ErrNotOwner, as a store does
// for a key taken over while its handler ran.
type takenOverStore struct {
	*MemoryStore
	completes atomic.Int64
}

func (s *takenOverStore) Complete(context.Context, Fence, Record, Response) error {
	s.completes.Add(1)
	return ErrNotOwner
}

// levelLog keeps the level and message of every record logged.
type levelLog struct {
	mu      sync.Mutex
	records []string // "LEVEL message"
}

func (l *levelLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *levelLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *levelLog) WithGroup(string) slog.Handler            { return l }
func (l *levelLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Level.String()+" "+r.Message)
	return nil
}

// has reports whether a record of level holds text.
func (l *levelLog) has(level slog.Level, text string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.records {
		if strings.HasPrefix(r, level.String()+" ") && strings.Contains(r, text) {
			return true
		}
	}
	return false
}

// TestSettleTakenOver: a key taken over while its handler ran (the first
// Complete answers ErrNotOwner) is a settle failure: counted in
// idempotency_settle_failures_total, logged at ERROR, reported to the
// Observer with RecordFailed, and not retried. The client still gets the
// handler's answer.
func TestSettleTakenOver(t *testing.T) {
	t.Parallel()
	s := &takenOverStore{MemoryStore: NewMemoryStore()}
	logs := &levelLog{}
	var observed []Observation
	mw, err := New(s, Config{Registerer: prometheus.NewRegistry(), Logger: slog.New(logs),
		Enabled:  func(context.Context) bool { return true },
		Observer: func(_ context.Context, o Observation) { observed = append(observed, o) }})
	if err != nil {
		t.Fatal(err)
	}
	rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(orderHandler))
	if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != 201 {
		t.Fatalf("the client did not get the handler's answer: %d %s", w.Code, w.Body)
	}
	if n := counter(t, mw.metrics.settleFailures.WithLabelValues("orders")); n != 1 {
		t.Errorf("idempotency_settle_failures_total{endpoint=orders} = %v, want 1", n)
	}
	if !logs.has(slog.LevelError, "taken over") {
		t.Errorf("no ERROR log says the key was taken over: %q", logs.records)
	}
	if len(observed) != 1 || observed[0].Outcome != OutcomeExecuted || !observed[0].RecordFailed {
		t.Errorf("observed %+v, want one executed call with RecordFailed", observed)
	}
	if n := s.completes.Load(); n != 1 {
		t.Errorf("Complete called %d times, want 1: a key taken over is not retried", n)
	}
}
