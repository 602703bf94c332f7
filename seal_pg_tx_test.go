package idempotency_test

import (
	"net/http"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestSealedPostgresTransactional: on a transactional route the sealed
// record commits with the handler's writes, and replays; a response that
// cannot be sealed commits nothing (503: the writes and the claim roll
// back), so the retry executes, once.
func TestSealedPostgresTransactional(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	inner := idempotency.NewPostgresStore(pool)
	keys := &flakyKeys{SealKeys: sealKeysOf(t, "k1")}
	rg := newSealRig(t, sealing(t, inner, keys), pool, idempotency.Config{})
	ctx := t.Context()
	orders := func(key string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE idem_key = $1`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	key, secret := uuid.NewString(), newSecret()
	first := sealSend(rg.tx, key, secret)
	if first.Code != http.StatusCreated || orders(key) != 1 {
		t.Fatalf("first answer %d %s, %d orders", first.Code, first.Body, orders(key))
	}
	if raw := readRaw(t, inner, key); raw.Status != idempotency.StatusCompleted || raw.Response.SealKeyID != "k1" {
		t.Fatalf("the key's row: %s, sealed with %q", raw.Status, raw.Response.SealKeyID)
	}
	sameAnswer(t, "transactional replay", first, sealSend(rg.tx, key, "s"))
	sameAnswer(t, "replay on an ordinary route", first, sealSend(rg.closed, key, "s"))

	keys.failSeal.Store(true)
	lost := uuid.NewString()
	wantUnavailable(t, "the seal failed", sealSend(rg.tx, lost, "s"))
	if n := orders(lost); n != 0 {
		t.Fatalf("%d orders committed without their record", n)
	}
	if rows, err := lookupKey(ctx, inner, lost, "", "orders"); err != nil || len(rows) != 0 {
		t.Fatalf("the key's row after the failed seal: %v, %v (want none: the claim rolled back)", rows, err)
	}
	if n := gathered(t, rg.reg, "idempotency_record_failures_total", "orders"); n != 1 {
		t.Fatalf("%v record failures, want 1", n)
	}
	if n := gathered(t, rg.reg, "idempotency_store_errors_total", "commit", idempotency.ReasonSeal); n != 1 {
		t.Fatalf("%v seal errors of the commit, want 1", n)
	}
	keys.failSeal.Store(false)
	before := rg.calls.Load()
	retry := sealSend(rg.tx, lost, "s2")
	if retry.Code != http.StatusCreated || retry.Header().Get(idempotency.HeaderReplayed) != "" || orders(lost) != 1 {
		t.Fatalf("the retry: %d %s, %d orders; want it executed, once", retry.Code, retry.Body, orders(lost))
	}
	sameAnswer(t, "the retry's replay", retry, sealSend(rg.tx, lost, "s3"))
	if n := rg.calls.Load() - before; n != 1 {
		t.Fatalf("the retry and its replay ran the handler %d times, want once", n)
	}
}

// TestSealedPostgresExpiredRowIsNew: an expired sealed row whose key is
// gone (retired) does not block its key: it is taken over as a new key,
// without being opened, and sealed with the active key.
func TestSealedPostgresExpiredRowIsNew(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	inner := idempotency.NewPostgresStore(pool)
	old := newSealRig(t, sealing(t, inner, sealKeysOf(t, "k1")), pool, idempotency.Config{})
	key := uuid.NewString()
	if w := sealSend(old.closed, key, "s"); w.Code != http.StatusCreated {
		t.Fatal(w.Code)
	}
	if _, err := pool.Exec(t.Context(), `UPDATE idempotency_keys SET expires_at = now() - interval '1 second', retain_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	rg := newSealRig(t, sealing(t, inner, sealKeysOf(t, "k2")), pool, idempotency.Config{})
	if w := sealSend(rg.closed, key, "s"); w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "" || rg.calls.Load() != 1 {
		t.Fatalf("the expired key: %d %s, %d runs; want a new execution", w.Code, w.Body, rg.calls.Load())
	}
	if raw := readRaw(t, inner, key); raw.Attempt != 2 || raw.Response.SealKeyID != "k2" {
		t.Fatalf("the row after the takeover: attempt %d, sealed with %q", raw.Attempt, raw.Response.SealKeyID)
	}
}
