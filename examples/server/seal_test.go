package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/internal/testdb"
)

// testSealKeys: k2 active, k1 to open older rows.
const testSealKeys = "k2:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=,k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="

// TestRunSealed: with IDEMPOTENCY_SEAL_KEYS (or -seal-keys-file) the
// server says at start-up that it seals, with which key id, and stores
// orders sealed: replays work, the table holds no body or header of them.
// Without keys it says it does not seal.
func TestRunSealed(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewDSN(t)
	file := filepath.Join(t.TempDir(), "seal-keys")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(testSealKeys, ",", "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"environment", nil, map[string]string{envSealKeys: testSealKeys}},
		{"file", []string{"-seal-keys-file", file}, map[string]string{envSealKeys: "ignored:when-the-file-is-given"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := newLogWatcher()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			env := map[string]string{envDatabaseURL: dsn}
			for k, v := range c.env {
				env[k] = v
			}
			errc := make(chan error, 1)
			go func() {
				errc <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, c.args...), getenvOf(env), &strings.Builder{}, logs)
			}()
			if l := logs.waitFor(t, "sealing stored responses"); l["seal_key_id"] != "k2" {
				t.Fatalf("start-up line %v", l)
			}
			listening := logs.waitFor(t, "listening")
			cl := newClient(t, "http://"+fmt.Sprint(listening["addr"]))
			_, tok := cl.newUser(t)
			key := uuid.NewString()
			first := cl.order(t, tok, key, aapl(2))
			expect(t, first, http.StatusCreated, "")
			if r := cl.order(t, tok, key, aapl(2)); r.Header.Get("Idempotent-Replayed") != "true" || r.Body["id"] != first.Body["id"] {
				t.Fatalf("replay %s, first %s", r, first)
			}
			db, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close(context.Background())
			var row string
			var keyID *string
			if err := db.QueryRow(ctx, `SELECT t::text, seal_key_id FROM idempotency_keys t WHERE idem_key = $1`, key).Scan(&row, &keyID); err != nil {
				t.Fatal(err)
			}
			if keyID == nil || *keyID != "k2" || strings.Contains(row, "AAPL") || strings.Contains(row, "fill_price") || strings.Contains(row, "/api/trading/orders/") {
				t.Fatalf("the stored row (sealed with %v): %s", keyID, row)
			}
			cancel()
			if err := waitErr(t, errc); err != nil {
				t.Fatal(err)
			}
		})
	}

	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, []string{"-addr", "127.0.0.1:0"}, getenvOf(nil), &strings.Builder{}, logs) }()
	logs.waitFor(t, "stored responses are not sealed (set IDEMPOTENCY_SEAL_KEYS or -seal-keys-file to seal them)")
	logs.waitFor(t, "listening")
	cancel()
	if err := waitErr(t, errc); err != nil {
		t.Fatal(err)
	}
}

// TestSealKeysMalformed: malformed keys stop the server at start-up with a
// usage error (exit status 2) naming the entry by position and ID, never
// its text, and nothing starts.
func TestSealKeysMalformed(t *testing.T) {
	t.Parallel()
	key := "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="
	for _, c := range []struct {
		args       []string
		keys, want string
	}{
		{nil, "k1:" + key + ",k2:" + key[:20], `IDEMPOTENCY_SEAL_KEYS: idempotency: seal keys: entry 2 (ID "k2"): the key is not`},
		{nil, key, "entry 1 has no ':'"},
		{nil, " , ", "no keys"},
		{[]string{"-seal-keys-file", filepath.Join(t.TempDir(), "missing")}, "", "-seal-keys-file"},
	} {
		var stderr strings.Builder
		err := run(context.Background(), c.args, getenvOf(map[string]string{envSealKeys: c.keys}), &strings.Builder{}, &stderr)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("keys %q: %v, want a usage error with %q", c.keys, err, c.want)
		}
		if strings.Contains(err.Error(), key[:12]) || strings.Contains(stderr.String(), key[:12]) {
			t.Fatalf("the error shows a key: %v", err)
		}
		if stderr.Len() != 0 {
			t.Fatalf("the server logged %q: it started", stderr.String())
		}
		if code := exitCode(err, &strings.Builder{}); code != 2 {
			t.Fatalf("exit status %d, want 2", code)
		}
	}
}
