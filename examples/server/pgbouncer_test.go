package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPgBouncerServer runs the server through PgBouncer in transaction
// mode, its migrations on the direct URL (-migrate-database-url): the
// tables exist, an order is placed once and replayed.
func TestPgBouncerServer(t *testing.T) {
	t.Parallel()
	pooled, direct := testdb.NewPgBouncerDSN(t)
	cfg, err := parseConfig([]string{"-addr", "127.0.0.1:0", "-database-url", pooled, "-migrate-database-url", direct},
		func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogWatcher()
	cfg.logger = slogJSON(logs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- serve(ctx, cfg) }()

	listening := logs.waitFor(t, "listening")
	c := newClient(t, "http://"+fmt.Sprint(listening["addr"]))
	_, tok := c.newUser(t)
	key := uuid.NewString()
	first := c.order(t, tok, key, aapl(1))
	expect(t, first, http.StatusCreated, "")
	again := c.order(t, tok, key, aapl(1))
	expect(t, again, http.StatusCreated, "")
	if again.Body["id"] != first.Body["id"] || again.Body["idempotency_replayed"] != true {
		t.Fatalf("second answer %s, want a replay of %s", again, first)
	}

	conn, err := pgx.Connect(t.Context(), direct)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var orders, keys int
	if err := conn.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM paper_orders), (SELECT count(*) FROM idempotency_keys)`).Scan(&orders, &keys); err != nil {
		t.Fatal(err)
	}
	if orders != 1 || keys != 1 {
		t.Fatalf("%d orders and %d keys, want 1 and 1", orders, keys)
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("serve did not return after its context ended")
	}
}
