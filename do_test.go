package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
)

// newOp returns the Operation "settle-payment" over store, the kill-switch
// on unless cfg says otherwise, Scoped unless rc guards its keys by length
// (payment's calls carry a scope).
func newOp(t *testing.T, store idempotency.Store, cfg idempotency.Config, rc idempotency.RouteConfig) *idempotency.Operation {
	t.Helper()
	rc.Scoped = rc.Scoped || rc.MinKeyLength < 16
	cfg.Registerer, cfg.Logger = nil, nil // newMiddleware's own
	op, err := newMiddleware(t, store, cfg).Operation("settle-payment", rc)
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// receipt is a value Do stores; Extra comes back from JSON as float64.
type receipt struct {
	Ledger int64 `json:"ledger"`
	Extra  any   `json:"extra"`
}

// payment is one call's request bytes.
func payment(key string) idempotency.Call {
	return idempotency.Call{Key: key, Scope: "user-7", Request: []byte(`{"amount": 100, "currency": "EUR"}`)}
}

// wantAnswer checks that err is the contract's answer standing for want,
// with status.
func wantAnswer(t *testing.T, what string, err, want error, status int) *idempotency.ErrorAnswer {
	t.Helper()
	var ea *idempotency.ErrorAnswer
	if !errors.Is(err, want) || !errors.As(err, &ea) || ea.Status != status {
		t.Fatalf("%s: %v (%T); want an *ErrorAnswer %d standing for %v", what, err, err, status, want)
	}
	return ea
}

// TestDoStorm: many concurrent calls with one key run the function exactly
// once; every other call gets the first run's value or ErrInFlight, and a
// call after it replays the value.
func TestDoStorm(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, store idempotency.Store) {
		op := newOp(t, store, idempotency.Config{}, idempotency.RouteConfig{})
		var runs atomic.Int64
		key := "msg-" + uuid.NewString()
		const n = 32
		start := make(chan struct{})
		var wg sync.WaitGroup
		var replayed, inFlight atomic.Int64
		for range n {
			wg.Go(func() {
				<-start
				v, info, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) {
					return receipt{Ledger: runs.Add(1)}, nil
				})
				switch {
				case errors.Is(err, idempotency.ErrInFlight):
					inFlight.Add(1)
				case err != nil:
					t.Errorf("storm: %v", err)
				case v.Ledger != 1:
					t.Errorf("storm: value %+v, want the one run's", v)
				case info.Replayed:
					replayed.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if runs.Load() != 1 {
			t.Fatalf("%d runs of one key, want exactly 1", runs.Load())
		}
		if replayed.Load()+inFlight.Load() != n-1 {
			t.Fatalf("replayed %d, in flight %d of %d duplicates", replayed.Load(), inFlight.Load(), n-1)
		}
		v, info, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) {
			return receipt{}, errors.New("ran again")
		})
		if err != nil || !info.Replayed || v.Ledger != 1 {
			t.Fatalf("after the storm: %+v %+v %v; want the replay", v, info, err)
		}
	})
}

// TestDoOutcomes: the function's error decides the outcome, and every
// retry with the key gets it back.
func TestDoOutcomes(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, store idempotency.Store) {
		op := newOp(t, store, idempotency.Config{}, idempotency.RouteConfig{})
		t.Run("Value", func(t *testing.T) {
			var runs atomic.Int64
			fn := func(context.Context) (receipt, error) { runs.Add(1); return receipt{Ledger: 42, Extra: 7}, nil }
			key := uuid.NewString()
			first, info, err := idempotency.Do(t.Context(), op, payment(key), fn)
			if err != nil || info.Replayed || info.Bypassed || info.Expires.IsZero() {
				t.Fatalf("first: %+v %v; want a run that advertises its row's expiry", info, err)
			}
			// Decoded from its encoding on the first run too: an any field
			// is JSON's float64 both times.
			if first.Extra != float64(7) {
				t.Fatalf("first run's value %#v, want it decoded from its JSON (Extra float64(7))", first)
			}
			again, info, err := idempotency.Do(t.Context(), op, payment(key), fn)
			if err != nil || !info.Replayed || !reflect.DeepEqual(again, first) || runs.Load() != 1 {
				t.Fatalf("replay: %#v %+v %v after %d runs; want %#v replayed", again, info, err, runs.Load(), first)
			}
		})
		t.Run("PermanentError", func(t *testing.T) {
			var runs atomic.Int64
			fn := func(context.Context) (receipt, error) {
				runs.Add(1)
				return receipt{}, fmt.Errorf("ledger: %w", &idempotency.PermanentError{Code: "insufficient_funds", Message: "balance 12.00 EUR"})
			}
			key := uuid.NewString()
			for i, wantReplayed := range []bool{false, true} {
				_, info, err := idempotency.Do(t.Context(), op, payment(key), fn)
				pe, ok := err.(*idempotency.PermanentError)
				if !ok || pe.Code != "insufficient_funds" || pe.Message != "balance 12.00 EUR" || info.Replayed != wantReplayed {
					t.Fatalf("call %d: %v (%T) %+v; want the same *PermanentError, replayed %v", i, err, err, info, wantReplayed)
				}
			}
			if runs.Load() != 1 {
				t.Fatalf("%d runs, want 1", runs.Load())
			}
		})
		t.Run("RetryableReleases", func(t *testing.T) {
			busy := errors.New("ledger busy")
			var runs atomic.Int64
			key := uuid.NewString()
			_, _, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) {
				runs.Add(1)
				return receipt{}, idempotency.Retryable(busy)
			})
			if !errors.Is(err, busy) {
				t.Fatalf("retryable: %v, want the function's error", err)
			}
			// A consumer tests for the outcome, to nack the message.
			var re *idempotency.RetryableError
			if !errors.Is(err, idempotency.ErrRetryable) || !errors.As(err, &re) || re.Err != busy {
				t.Fatalf("retryable: %v (%T), want a *RetryableError that errors.Is ErrRetryable and holds the function's error", err, err)
			}
			v, info, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) {
				runs.Add(1)
				return receipt{Ledger: 1}, nil
			})
			if err != nil || info.Replayed || v.Ledger != 1 || runs.Load() != 2 {
				t.Fatalf("after a retryable error: %+v %+v %v, %d runs; want a second run", v, info, err, runs.Load())
			}
		})
		t.Run("OtherErrorFails", func(t *testing.T) {
			boom := errors.New("ledger down")
			key := uuid.NewString()
			if _, _, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) { return receipt{}, boom }); !errors.Is(err, boom) {
				t.Fatalf("first: %v, want the function's error", err)
			}
			_, _, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) {
				t.Error("a failed key ran again")
				return receipt{}, nil
			})
			wantAnswer(t, "after a failure", err, idempotency.ErrPreviousFailed, 409)
		})
		t.Run("PanicFails", func(t *testing.T) {
			key := uuid.NewString()
			func() {
				defer func() {
					if p := recover(); p != "ledger panicked" {
						t.Fatalf("recovered %v, want the function's panic re-raised", p)
					}
				}()
				_, _, _ = idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) { panic("ledger panicked") })
				t.Fatal("Do returned after its function panicked")
			}()
			_, _, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) {
				t.Error("a key that panicked ran again")
				return receipt{}, nil
			})
			wantAnswer(t, "after a panic", err, idempotency.ErrPreviousFailed, 409)
		})
	})
}

// TestDoContext: the function runs detached from the caller's
// cancellation, with the key in its context and a deadline of the lease
// less the store timeout.
func TestDoContext(t *testing.T) {
	t.Parallel()
	op := newOp(t, idempotency.NewMemoryStore(), idempotency.Config{Lease: 10 * time.Second, StoreTimeout: time.Second}, idempotency.RouteConfig{})
	ctx, cancel := context.WithCancel(context.WithValue(t.Context(), ctxProbe{}, "kept"))
	key := uuid.NewString()
	start := time.Now()
	_, _, err := idempotency.Do(ctx, op, payment(key), func(ctx context.Context) (receipt, error) {
		cancel() // the consumer shuts down mid-message
		if ctx.Err() != nil {
			t.Error("the caller's cancellation reached the function")
		}
		if k, ok := idempotency.KeyFromContext(ctx); !ok || k != key {
			t.Errorf("KeyFromContext = %q, %v", k, ok)
		}
		if ctx.Value(ctxProbe{}) != "kept" {
			t.Error("the caller's context values are gone")
		}
		d, ok := ctx.Deadline()
		if !ok || d.Before(start.Add(8*time.Second)) || d.After(time.Now().Add(9*time.Second)) {
			t.Errorf("deadline %v from now, want about the lease less the store timeout (9s)", time.Until(d))
		}
		return receipt{Ledger: 1}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

type ctxProbe struct{}

// TestOperationConfig: bad configuration fails at construction.
func TestOperationConfig(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		name string
		rc   idempotency.RouteConfig
	}{
		"no name":          {"", idempotency.RouteConfig{}},
		"NUL in name":      {"a\x00b", idempotency.RouteConfig{}},
		"the http adapter": {"http:/x", idempotency.RouteConfig{}},
		"HTTP Name":        {"op", idempotency.RouteConfig{Name: "POST /x"}},
		"ParseKey":         {"op", idempotency.RouteConfig{ParseKey: func(string) (string, error) { return "", nil }}},
		"RequireKey":       {"op", idempotency.RouteConfig{RequireKey: true}},
		"ReplayHeaders":    {"op", idempotency.RouteConfig{ReplayHeaders: []string{"X-A"}}},
		"MaxBodyBytes":     {"op", idempotency.RouteConfig{MaxBodyBytes: 10}},
		"short TTL":        {"op", idempotency.RouteConfig{TTL: time.Second}},
		"no TxStore":       {"op", idempotency.RouteConfig{Transactional: true}},
	} {
		if _, err := mw.Operation(c.name, c.rc); err == nil {
			t.Errorf("%s: Operation accepted it", name)
		}
	}
	if _, err := mw.Route(idempotency.RouteConfig{Codec: jsonish{}}); err == nil {
		t.Error("a route accepted a Codec")
	}
	for _, name := range []string{"do:settle", "grpc:/pkg.Service/Method"} {
		if _, err := mw.Route(idempotency.RouteConfig{Name: name}); err == nil {
			t.Errorf("a route took the name %q of an Operation's endpoint", name)
		}
	}
	if _, err := mw.Operation("grpc:/pkg.Service/Method", idempotency.RouteConfig{KeyFormat: idempotency.KeyOpaque, MinKeyLength: 16}); err != nil {
		t.Errorf("an adapter's Operation: %v", err)
	}
}

// TestDoCodec: a Codec of one's own stores the value as its raw bytes.
func TestDoCodec(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, store idempotency.Store) {
		op := newOp(t, store, idempotency.Config{}, idempotency.RouteConfig{Codec: jsonish{}})
		key := uuid.NewString()
		fn := func(context.Context) (string, error) { return "receipt 42", nil }
		first, _, err := idempotency.Do(t.Context(), op, payment(key), fn)
		if err != nil || first != "receipt 42" {
			t.Fatalf("first: %q %v", first, err)
		}
		again, info, err := idempotency.Do(t.Context(), op, payment(key), fn)
		if err != nil || !info.Replayed || again != first {
			t.Fatalf("replay: %q %+v %v", again, info, err)
		}
		recs, err := store.ExportScope(t.Context(), "user-7")
		if err != nil || len(recs) != 1 || recs[0].Response.BodyKind != idempotency.BodyRaw || string(recs[0].Response.Body) != "<receipt 42>" {
			t.Fatalf("stored %+v %v; want the codec's bytes, raw", recs, err)
		}
	})
}

// jsonish is a Codec of strings, wrapped in angle brackets.
type jsonish struct{}

func (jsonish) Marshal(v any) ([]byte, error) { return []byte("<" + v.(string) + ">"), nil }
func (jsonish) Unmarshal(b []byte, v any) error {
	if len(b) < 2 || b[0] != '<' || b[len(b)-1] != '>' {
		return errors.New("not jsonish")
	}
	*v.(*string) = string(b[1 : len(b)-1])
	return nil
}

// TestExec: an adapter's Response is recorded as it is, with metadata
// under a reserved header name, and its status decides the outcome.
func TestExec(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, store idempotency.Store) {
		mw, err := idempotency.New(store, idempotency.Config{Registerer: prometheus.NewRegistry(), Logger: quiet,
			Enabled: func(context.Context) bool { return true }})
		if err != nil {
			t.Fatal(err)
		}
		op, err := mw.Operation("grpc:/payments.v1.Ledger/Settle", idempotency.RouteConfig{MinKeyLength: 16})
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int64
		exec := func(key string, status int) (idempotency.Response, idempotency.CallInfo, error) {
			return op.Exec(t.Context(), idempotency.Call{Key: key, Request: []byte{0x0a, 0x02, 0x08, 0x01}}, func(context.Context) idempotency.Response {
				runs.Add(1)
				return idempotency.Response{Status: status, Header: map[string][]string{":grpc": {"0", "payments.v1.Receipt"}},
					Body: []byte{0x08, 0x2a}, BodyKind: idempotency.BodyRaw}
			})
		}
		key := uuid.NewString()
		if _, _, err := exec(key, 200); err != nil {
			t.Fatal(err)
		}
		resp, info, err := exec(key, 200)
		if err != nil || !info.Replayed || resp.Status != 200 || string(resp.Body) != "\x08\x2a" ||
			!reflect.DeepEqual(resp.Header[":grpc"], []string{"0", "payments.v1.Receipt"}) || runs.Load() != 1 {
			t.Fatalf("replay: %+v %+v %v after %d runs", resp, info, err, runs.Load())
		}
		released := uuid.NewString()
		for range 2 {
			if _, info, err := exec(released, 429); err != nil || info.Replayed {
				t.Fatalf("429: %+v %v", info, err)
			}
		}
		if runs.Load() != 3 {
			t.Fatalf("%d runs; a 429 must release its key", runs.Load())
		}
		failed := uuid.NewString()
		_, _, _ = exec(failed, 503)
		_, _, err = exec(failed, 200)
		wantAnswer(t, "after a 503", err, idempotency.ErrPreviousFailed, 409)
		if runs.Load() != 4 {
			t.Fatalf("%d runs; a failed key must not run again", runs.Load())
		}
	})
}
