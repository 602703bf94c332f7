package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
)

// TestSealingStoreConformance: a sealing store over the memory store
// passes the whole store suite (its Postgres twin is in seal_pg_test.go).
func TestSealingStoreConformance(t *testing.T) {
	t.Parallel()
	idempotencytest.Run(t, func(t *testing.T) idempotency.Store {
		return sealing(t, idempotency.NewMemoryStore(), sealKeysOf(t, "k1"))
	})
}

// TestSealedRoundTrip: a response is recorded sealed (the table holds no
// body, no header, only the key id and the status) and every replay
// equals the first answer; export opens it, an older key still opens it.
func TestSealedRoundTrip(t *testing.T) {
	t.Parallel()
	sealStores(t, func(t *testing.T, inner idempotency.Store, pool *pgxpool.Pool) {
		rg := newSealRig(t, sealing(t, inner, sealKeysOf(t, "k1")), pool, idempotency.Config{})
		key, secret := uuid.NewString(), newSecret()
		first := sealSend(rg.closed, key, secret)
		if first.Code != http.StatusCreated || !strings.Contains(first.Body.String(), secret) {
			t.Fatalf("first answer %d %s", first.Code, first.Body)
		}
		for i := range 3 {
			sameAnswer(t, "replay", first, sealSend(rg.open, key, newSecret()))
			if i == 0 {
				sameAnswer(t, "replay on the fail-closed route", first, sealSend(rg.closed, key, newSecret()))
			}
		}
		if n := rg.calls.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want once", n)
		}

		raw := readRaw(t, inner, key)
		resp := raw.Response
		if resp.SealKeyID != "k1" || resp.Status != http.StatusCreated || resp.Header != nil || resp.BodyKind != idempotency.BodyRaw ||
			bytes.Contains(resp.Body, []byte(secret)) || bytes.Contains(resp.Body, []byte("1234.56")) || resp.Body[0] != 1 {
			t.Fatalf("stored row %+v: want sealed with k1, status 201, no headers, the body not readable", resp)
		}

		recs, err := rg.store.ExportScope(t.Context(), "")
		if err != nil || len(recs) != 1 || !bytes.Contains(recs[0].Response.Body, []byte(secret)) ||
			recs[0].Response.Header.Get("Location") != "/orders/"+secret || recs[0].Response.SealKeyID != "" {
			t.Fatalf("export through the sealing store: %+v, %v", recs, err)
		}
		// Rotation: k2 active, k1 still opens what it sealed.
		rotated := newSealRig(t, sealing(t, inner, sealKeysOf(t, "k2", "k1")), pool, idempotency.Config{})
		sameAnswer(t, "replay after k2 became active", first, sealSend(rotated.closed, key, newSecret()))
		if n := rotated.calls.Load(); n != 0 {
			t.Fatalf("the rotated middleware ran the handler %d times", n)
		}
	})
}

// TestSealedRowWithoutItsKey: a sealed row answers 503 on both policies,
// never runs the handler and never replays the bytes, to a store that does
// not seal and to a sealing store without its key; each is counted under
// the reason unseal and logged at ERROR with the row's id and key id.
func TestSealedRowWithoutItsKey(t *testing.T) {
	t.Parallel()
	sealStores(t, func(t *testing.T, inner idempotency.Store, pool *pgxpool.Pool) {
		writer := newSealRig(t, sealing(t, inner, sealKeysOf(t, "k1")), pool, idempotency.Config{})
		key := uuid.NewString()
		if w := sealSend(writer.closed, key, newSecret()); w.Code != http.StatusCreated {
			t.Fatalf("first answer %d %s", w.Code, w.Body)
		}
		row := readRaw(t, inner, key)
		for name, store := range map[string]idempotency.Store{
			"store that does not seal": inner,
			"other key only":           sealing(t, inner, sealKeysOf(t, "k2")),
		} {
			rg := newSealRig(t, store, pool, idempotency.Config{})
			routes := map[string]http.Handler{"fail-closed": rg.closed, "fail-open": rg.open}
			if rg.tx != nil {
				routes["transactional"] = rg.tx
			}
			for route, h := range routes {
				wantUnavailable(t, name+", "+route, sealSend(h, key, newSecret()))
			}
			if n := rg.calls.Load(); n != 0 {
				t.Fatalf("%s: the handler ran %d times", name, n)
			}
			if n := gathered(t, rg.reg, "idempotency_store_errors_total", "claim", idempotency.ReasonUnseal) +
				gathered(t, rg.reg, "idempotency_store_errors_total", "begin", idempotency.ReasonUnseal); n != float64(len(routes)) {
				t.Fatalf("%s: %v unseal store errors counted, want %d", name, n, len(routes))
			}
			if n := gathered(t, rg.reg, "idempotency_bypasses_total", "orders", "store_unavailable"); n != 0 {
				t.Fatalf("%s: %v bypasses", name, n)
			}
			logs := rg.errorLogs(t)
			if len(logs) != len(routes) {
				t.Fatalf("%s: %d ERROR logs, want %d:\n%s", name, len(logs), len(routes), rg.logs)
			}
			for _, l := range logs {
				if l["seal_key_id"] != "k1" || l["row_id"] != float64(row.ID) || l["key"] != key || l["reason"] != "unseal" {
					t.Fatalf("%s: ERROR log %v, want the row's id, the key and key id k1", name, l)
				}
			}
			if strings.Contains(rg.logs.String(), base64Key("k1")) || strings.Contains(rg.logs.String(), base64Key("k2")) {
				t.Fatalf("%s: a key in the log", name)
			}
		}
	})
}

// base64Key is the KEY part of sealKeyText(id).
func base64Key(id string) string { _, k, _ := strings.Cut(sealKeyText(id), ":"); return k }

// TestSealedValueCopiedDoesNotOpen: a sealed value copied to another row,
// of another key, another user or with another status, does not open
// there: 503, and nothing runs. (seal_pg_test.go copies within the table,
// and flips a byte in place.)
func TestSealedValueCopiedDoesNotOpen(t *testing.T) {
	t.Parallel()
	sealStores(t, func(t *testing.T, inner idempotency.Store, pool *pgxpool.Pool) {
		rg := newSealRig(t, sealing(t, inner, sealKeysOf(t, "k1")), pool, idempotency.Config{})
		key := uuid.NewString()
		if w := sealSend(rg.closed, key, newSecret()); w.Code != http.StatusCreated {
			t.Fatalf("first answer %d %s", w.Code, w.Body)
		}
		stolen := readRaw(t, inner, key).Response
		for _, target := range []struct {
			name, user string
			status     int
		}{{"another key", "", 201}, {"another user", "u2", 201}, {"another status", "u3", 200}} {
			// The target row as the middleware would claim it, then
			// recorded with the stolen value through the inner store.
			k := uuid.NewString()
			r := sealSendAs(newSealRig(t, inner, pool, idempotency.Config{}).closed, target.user, k, "x")
			if r.Code != http.StatusCreated {
				t.Fatalf("%s: setup %d", target.name, r.Code)
			}
			rec := readRawAs(t, inner, target.user, k)
			copyInto(t, inner, rec, idempotency.Response{Status: target.status, Body: stolen.Body, BodyKind: idempotency.BodyRaw, SealKeyID: "k1"})
			wantUnavailable(t, target.name, sealSendAs(rg.closed, target.user, k, newSecret()))
		}
		if n := rg.calls.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want once (the original)", n)
		}
	})
}

// copyInto replaces rec's recorded response by resp, through the store
// API: an operator with write access to the table. The row is released and
// claimed again under the same key first, so that it can be completed.
func copyInto(t *testing.T, inner idempotency.Store, rec idempotency.Record, resp idempotency.Response) {
	t.Helper()
	ctx := t.Context()
	if _, err := inner.Erase(ctx, rec.Scope); err != nil {
		t.Fatal(err)
	}
	res, err := inner.Claim(ctx, idempotency.ClaimRequest{Key: rec.Key, Scope: rec.Scope, Endpoint: rec.Endpoint,
		RequestHash: rec.RequestHash, TTL: time.Hour, Lease: time.Minute})
	if err != nil || !res.Won {
		t.Fatalf("claim again: %+v, %v", res, err)
	}
	if err := inner.Complete(ctx, res.Record.Fence(), res.Record, resp); err != nil {
		t.Fatal(err)
	}
}

// TestSealingKeySourceFails: a key source that fails while sealing is a
// record failure (the client gets the handler's answer, the key stays in
// flight, then answers outcome_unknown; counted and logged); while
// opening, every policy answers 503 and nothing runs.
func TestSealingKeySourceFails(t *testing.T) {
	t.Parallel()
	sealStores(t, func(t *testing.T, inner idempotency.Store, pool *pgxpool.Pool) {
		keys := &flakyKeys{SealKeys: sealKeysOf(t, "k1")}
		rg := newSealRig(t, sealing(t, inner, keys), pool, idempotency.Config{Lease: 400 * time.Millisecond, StoreTimeout: 100 * time.Millisecond})

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

// TestSealingReplaysPlaintextRows: a row recorded before sealing was
// turned on replays as it is through a sealing store, and is counted.
func TestSealingReplaysPlaintextRows(t *testing.T) {
	t.Parallel()
	sealStores(t, func(t *testing.T, inner idempotency.Store, pool *pgxpool.Pool) {
		before := newSealRig(t, inner, pool, idempotency.Config{})
		key := uuid.NewString()
		first := sealSend(before.closed, key, newSecret())
		rg := newSealRig(t, sealing(t, inner, sealKeysOf(t, "k1")), pool, idempotency.Config{})
		sameAnswer(t, "plaintext row through a sealing store", first, sealSend(rg.open, key, "s"))
		if n := gathered(t, rg.reg, "idempotency_plaintext_replays_total", "orders"); n != 1 {
			t.Fatalf("idempotency_plaintext_replays_total = %v, want 1", n)
		}
		if n := rg.calls.Load(); n != 0 {
			t.Fatalf("the handler ran %d times", n)
		}
		// A sealed row's replay is not counted as plaintext.
		k2 := uuid.NewString()
		sameAnswer(t, "sealed replay", sealSend(rg.closed, k2, "s"), sealSend(rg.closed, k2, "s"))
		if n := gathered(t, rg.reg, "idempotency_plaintext_replays_total", "orders"); n != 1 {
			t.Fatalf("idempotency_plaintext_replays_total = %v after a sealed replay, want 1", n)
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
