package sqlstore_test

import (
	"database/sql"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresSharesThePgxStoresTable: the pgx store and the database/sql
// store on one table. A key either records is found by the other as the
// same row, and its response (JSON body and headers, raw body) replays
// the same bytes; a claim either makes is a duplicate for the other.
func TestPostgresSharesThePgxStoresTable(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewDSN(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pgx := idempotency.NewPostgresStore(pool)
	for _, driver := range pgDrivers {
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(2)
		t.Cleanup(func() { _ = db.Close() })
		dsql := pgStore(t, db)
		for _, dir := range []struct {
			name           string
			writer, reader idempotency.Store
		}{{"pgx writes, " + driver + " reads", pgx, dsql}, {driver + " writes, pgx reads", dsql, pgx}} {
			for _, resp := range []idempotency.Response{
				{Status: 201, BodyKind: idempotency.BodyJSON, Body: []byte(`{"id":7,"symbol":"AAPL"}`),
					Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/7"}}},
				{Status: 200, BodyKind: idempotency.BodyRaw, Body: []byte("\x00raw bytes\xff")},
				// Backslashes, which bytea's text input would read as escapes.
				{Status: 201, BodyKind: idempotency.BodyJSON, Body: []byte(`{"path":"C:\\dir","q":"a\"b","x":"\\x41"}`),
					Header: http.Header{"Location": {`/a\b`}, "X-Hex": {`\x41`}}},
			} {
				req := idempotencytest.Request("user-1", time.Hour, time.Minute)
				rec := idempotencytest.MustClaim(t, dir.writer, req)
				if res, err := dir.reader.Claim(t.Context(), req); err != nil || res.Won || res.Record.ID != rec.ID || res.Record.Status != idempotency.StatusInFlight {
					t.Fatalf("%s: the other store's claim of an in-flight key: %+v, %v; want the same row, not won", dir.name, res, err)
				}
				if err := dir.writer.Complete(t.Context(), rec.Fence(), rec, resp); err != nil {
					t.Fatalf("%s: Complete: %v", dir.name, err)
				}
				got := idempotencytest.Read(t, dir.reader, req)
				if got.ID != rec.ID || got.Status != idempotency.StatusCompleted || got.Response.Status != resp.Status ||
					got.Response.BodyKind != resp.BodyKind || got.Response.Header.Get("Location") != resp.Header.Get("Location") {
					t.Fatalf("%s: read back %+v, want the recorded %+v", dir.name, got, resp)
				}
				if string(got.Response.Body) != string(resp.Body) || !reflect.DeepEqual(got.Response.Header, resp.Header) {
					t.Fatalf("%s: body %q and headers %v, want %q and %v", dir.name, got.Response.Body, got.Response.Header, resp.Body, resp.Header)
				}
			}
		}
	}
}
