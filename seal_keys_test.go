package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
)

// TestSealingKeySourceFails: a key source that fails while sealing is a
// record failure (the client gets the handler's answer, the key stays in
// flight, then answers outcome_unknown; counted and logged); while
// opening, every policy answers 503 and nothing runs.
func TestSealingKeySourceFails(t *testing.T) {
	t.Parallel()
	sealStores(t, func(t *testing.T, inner idempotency.Store, pool *pgxpool.Pool) {
		keys := &flakyKeys{SealKeys: sealKeysOf(t, "k1")}
		rg := newSealRig(t, sealing(t, inner, keys), pool, idempotency.Config{Lease: 2 * time.Second, StoreTimeout: time.Second})

		keys.failSeal.Store(true)
		key := uuid.NewString()
		if w := sealSend(rg.closed, key, "s"); w.Code != http.StatusCreated {
			t.Fatalf("the handler's answer: %d %s", w.Code, w.Body)
		}
		if n := gathered(t, rg.reg, "idempotency_record_failures_total", "orders"); n != 1 {
			t.Fatalf("%v record failures, want 1", n)
		}
		if n := gathered(t, rg.reg, "idempotency_store_errors_total", "complete", idempotency.ReasonSeal); n < 1 {
			t.Fatalf("%v seal store errors", n)
		}
		if raw := readRaw(t, inner, key); raw.Status != idempotency.StatusInFlight {
			t.Fatalf("row after the failed seal: %s", raw.Status)
		}
		logs := rg.errorLogs(t)
		if len(logs) != 1 || !strings.Contains(logs[0]["error"].(string), "kms: connection refused") {
			t.Fatalf("ERROR logs %v", logs)
		}
		keys.failSeal.Store(false)
		for deadline := time.Now().Add(10 * time.Second); ; {
			w := sealSend(rg.open, key, "s")
			if strings.Contains(w.Body.String(), "idempotency_outcome_unknown") {
				break
			}
			if !strings.Contains(w.Body.String(), "idempotency_in_flight") || time.Now().After(deadline) {
				t.Fatalf("the key after the failed seal: %d %s", w.Code, w.Body)
			}
			time.Sleep(20 * time.Millisecond) // waiting out the lease, by the store's clock
		}

		done := uuid.NewString()
		if w := sealSend(rg.closed, done, "s"); w.Code != http.StatusCreated {
			t.Fatal(w.Code)
		}
		keys.failOpen.Store(true)
		for _, h := range []http.Handler{rg.closed, rg.open} {
			wantUnavailable(t, "opening with the key source down", sealSend(h, done, "s"))
		}
		if n := rg.calls.Load(); n != 2 {
			t.Fatalf("the handler ran %d times, want 2", n)
		}
	})
}

// TestNewSealingStoreRefuses: no store, no keys, or keys without a usable
// active key fail at construction, naming no key.
func TestNewSealingStoreRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := idempotency.NewMemoryStore()
	broken := &flakyKeys{SealKeys: sealKeysOf(t, "k1")}
	broken.failSeal.Store(true)
	for name, call := range map[string]func() (idempotency.Store, error){
		"nil store":     func() (idempotency.Store, error) { return idempotency.NewSealingStore(ctx, nil, sealKeysOf(t, "k1")) },
		"nil keys":      func() (idempotency.Store, error) { return idempotency.NewSealingStore(ctx, mem, nil) },
		"failing keys":  func() (idempotency.Store, error) { return idempotency.NewSealingStore(ctx, mem, broken) },
		"short key":     func() (idempotency.Store, error) { return idempotency.NewSealingStore(ctx, mem, shortKey{}) },
		"malformed id":  func() (idempotency.Store, error) { return idempotency.NewSealingStore(ctx, mem, shortKey{id: "a b"}) },
		"cancelled ctx": func() (idempotency.Store, error) { return idempotency.NewSealingStore(cancelled(), mem, broken) },
	} {
		if s, err := call(); err == nil || s != nil {
			t.Errorf("%s: %v, %v; want an error", name, s, err)
		} else if strings.Contains(err.Error(), base64Key("k1")) {
			t.Errorf("%s: the error shows the key: %v", name, err)
		}
	}
}

type shortKey struct{ id string }

func (k shortKey) ActiveSealKey(context.Context) (string, []byte, error) {
	if k.id != "" {
		return k.id, make([]byte, 32), nil
	}
	return "k1", make([]byte, 16), nil
}

func (shortKey) SealKey(context.Context, string) ([]byte, error) { return nil, errors.New("none") }

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
