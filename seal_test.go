package idempotency_test

import (
	"bytes"
	"context"
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
			// The store answered all along: a new key is no "recovery".
			if w := sealSend(rg.closed, uuid.NewString(), "s"); w.Code != http.StatusCreated || strings.Contains(rg.logs.String(), "the store recovered") {
				t.Fatalf("%s: a new key answered %d; log:\n%s", name, w.Code, rg.logs)
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

// TestSealedResponseNotStored: a response too large to record keeps its
// status and headers sealed; its replay is still the 409 naming the
// original status, and a store that does not seal answers 503.
func TestSealedResponseNotStored(t *testing.T) {
	t.Parallel()
	inner := idempotency.NewMemoryStore()
	route := func(s idempotency.Store) http.Handler {
		mw, err := idempotency.New(s, idempotency.Config{Logger: quiet, Enabled: func(context.Context) bool { return true }})
		if err != nil {
			t.Fatal(err)
		}
		return mw.MustRoute(idempotency.RouteConfig{Name: "orders", MaxResponseBytes: 8})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/orders/secret-location")
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write([]byte("a body longer than eight bytes"))
		}))
	}
	sealed := route(sealing(t, inner, sealKeysOf(t, "k1")))
	key := uuid.NewString()
	if w := sealSend(sealed, key, "s"); w.Code != http.StatusAccepted {
		t.Fatal(w.Code)
	}
	raw := readRaw(t, inner, key).Response
	if raw.SealKeyID != "k1" || raw.Header != nil || bytes.Contains(raw.Body, []byte("secret-location")) {
		t.Fatalf("stored %+v", raw)
	}
	if w := sealSend(sealed, key, "s"); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), `"original_status":202`) {
		t.Fatalf("replay of a response not stored: %d %s", w.Code, w.Body)
	}
	wantUnavailable(t, "a store that does not seal", sealSend(route(inner), key, "s"))
}
