package idempotency_test

import (
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestSealingStoreConformancePostgres: a sealing store over the Postgres
// store passes the whole store suite.
func TestSealingStoreConformancePostgres(t *testing.T) {
	t.Parallel()
	idempotencytest.Run(t, func(t *testing.T) idempotency.Store {
		return sealing(t, idempotency.NewPostgresStore(testdb.New(t)), sealKeysOf(t, "k1"))
	})
}

// pgSealed is a sealing rig over a fresh schema, with k1 active.
func pgSealed(t *testing.T, keys idempotency.SealKeys) (*sealRig, *pgxpool.Pool) {
	t.Helper()
	pool := testdb.New(t)
	return newSealRig(t, sealing(t, idempotency.NewPostgresStore(pool), keys), pool, idempotency.Config{}), pool
}

// TestSealedPostgresTampering: what an operator with write access to the
// table can do to a sealed value: copy it to another key's row or another
// user's, change the row's status code, flip one of its bytes, or name
// another key id. Each row then answers 503 on every route and runs
// nothing.
func TestSealedPostgresTampering(t *testing.T) {
	t.Parallel()
	rg, pool := pgSealed(t, sealKeysOf(t, "k1", "k9"))
	plain := newSealRig(t, idempotency.NewPostgresStore(pool), pool, idempotency.Config{})
	ctx := t.Context()
	sealedKey := func(user string) string {
		k := uuid.NewString()
		if w := sealSendAs(rg.closed, user, k, newSecret()); w.Code != http.StatusCreated {
			t.Fatalf("setup: %d %s", w.Code, w.Body)
		}
		return k
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		tag, err := pool.Exec(ctx, sql, args...)
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("%s: %v, %d rows", sql, err, tag.RowsAffected())
		}
	}
	source := sealedKey("")
	copyTo := func(user string) string {
		k := uuid.NewString()
		if w := sealSendAs(plain.closed, user, k, "x"); w.Code != http.StatusCreated {
			t.Fatalf("setup: %d", w.Code)
		}
		exec(`UPDATE idempotency_keys t SET response_body = NULL, response_headers = NULL,
			response_body_raw = s.response_body_raw, seal_key_id = s.seal_key_id, response_code = s.response_code
			FROM idempotency_keys s WHERE s.idem_key = $1 AND t.idem_key = $2`, source, k)
		return k
	}
	cases := []struct{ name, user, key string }{
		{"copied to another key", "", copyTo("")},
		{"copied to another user", "u2", copyTo("u2")},
	}
	statusKey := sealedKey("u3")
	exec(`UPDATE idempotency_keys SET response_code = 200 WHERE idem_key = $1`, statusKey)
	cases = append(cases, struct{ name, user, key string }{"status changed", "u3", statusKey})
	flipKey := sealedKey("u4")
	exec(`UPDATE idempotency_keys SET response_body_raw = set_byte(response_body_raw, 20, get_byte(response_body_raw, 20) # 1) WHERE idem_key = $1`, flipKey)
	cases = append(cases, struct{ name, user, key string }{"a byte flipped", "u4", flipKey})
	otherID := sealedKey("u5")
	exec(`UPDATE idempotency_keys SET seal_key_id = 'k9' WHERE idem_key = $1`, otherID) // k9 exists, but did not seal it
	cases = append(cases, struct{ name, user, key string }{"another key id", "u5", otherID})
	unknownID := sealedKey("u6")
	exec(`UPDATE idempotency_keys SET seal_key_id = 'k7' WHERE idem_key = $1`, unknownID)
	cases = append(cases, struct{ name, user, key string }{"an unknown key id", "u6", unknownID})

	runs := rg.calls.Load()
	for _, c := range cases {
		for route, h := range map[string]http.Handler{"fail-closed": rg.closed, "fail-open": rg.open, "transactional": rg.tx} {
			wantUnavailable(t, c.name+", "+route, sealSendAs(h, c.user, c.key, newSecret()))
		}
	}
	if n := rg.calls.Load(); n != runs {
		t.Fatalf("the handler ran %d times on tampered rows", n-runs)
	}
	// The untouched source still replays.
	if w := sealSend(rg.closed, source, "s"); w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("the source row: %d %s", w.Code, w.Body)
	}
}

// TestSealedPostgresNoPlaintext: after orders on ordinary and
// transactional routes, no column of any row of the table holds a byte of
// a response's body or headers, in any form the row can be read in.
func TestSealedPostgresNoPlaintext(t *testing.T) {
	t.Parallel()
	rg, pool := pgSealed(t, sealKeysOf(t, "k1"))
	var secrets []string
	for i := range 20 {
		h := rg.closed
		if i%2 == 1 {
			h = rg.tx
		}
		s := newSecret()
		secrets = append(secrets, s)
		if w := sealSend(h, uuid.NewString(), s); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), s) {
			t.Fatalf("order %d: %d %s", i, w.Code, w.Body)
		}
	}
	ctx := t.Context()
	var text string // every row as text (bytea columns in hex), and every bytea column as escaped text
	if err := pool.QueryRow(ctx, `SELECT string_agg(t::text || ' ' || coalesce(encode(t.response_body_raw, 'escape'), ''), E'\n')
		FROM idempotency_keys t`).Scan(&text); err != nil {
		t.Fatal(err)
	}
	var orders string // the handler's own table holds the secrets: the search finds them where they are
	if err := pool.QueryRow(ctx, `SELECT string_agg(secret, ' ') FROM orders`).Scan(&orders); err != nil {
		t.Fatal(err)
	}
	for _, s := range append(secrets, "1234.56", "payment_session", "application/json") {
		for _, form := range []string{s, hex.EncodeToString([]byte(s))} {
			if strings.Contains(text, form) {
				t.Fatalf("the table holds %q (as %q) in plaintext:\n%s", s, form, text)
			}
		}
	}
	for i, s := range secrets {
		if i%2 == 1 && !strings.Contains(orders, s) {
			t.Fatalf("the orders table lacks %s", s)
		}
	}
	var plain int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys
		WHERE status <> 'completed' OR seal_key_id IS DISTINCT FROM 'k1' OR response_body IS NOT NULL OR response_headers IS NOT NULL
			OR response_code <> 201`).Scan(&plain); err != nil || plain != 0 {
		t.Fatalf("%d rows not sealed with k1 as completed 201s, %v", plain, err)
	}
}
