package idempotency

import (
	"context"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestClaimRowDecodedAsPgxScans: the claim's own decoding of its row
// (decodeClaimRow) gives what pgx's scan gives, for every shape of row (a
// new claim, in flight, completed with a JSON, raw, JSON-kept-raw or no
// body, failed), and it steps aside for pgx where pgx would decode
// differently: text results (the simple protocol) and a registered
// timestamptz codec with its own ScanLocation.
func TestClaimRowDecodedAsPgxScans(t *testing.T) {
	t.Parallel()
	utc := func(c *pgxpool.Config) {
		c.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
			conn.TypeMap().RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID,
				Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC}})
			return nil
		}
	}
	simple := func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol }
	for _, c := range []struct {
		name      string
		configure func(*pgxpool.Config)
		decodes   bool // decodeClaimRow decodes, rather than leaving it to pgx
	}{
		{"default", func(*pgxpool.Config) {}, true},
		{"simple protocol", simple, false},
		{"timestamptz in UTC", utc, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t, testdb.Configure(c.configure))
			claimRowShapes(t, pool, c.decodes)
		})
	}
}

// claimRowShapes makes each shape of row, then reads it through
// scanClaimRows and through pgx's QueryRow and scanClaim, and compares.
func claimRowShapes(t *testing.T, pool *pgxpool.Pool, decodes bool) {
	ctx := t.Context()
	s := NewPostgresStore(pool)
	header := http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}}
	for _, shape := range []struct {
		name   string
		settle func(Fence) error
	}{
		{"in flight", func(Fence) error { return nil }},
		{"json", func(f Fence) error {
			return s.Complete(ctx, f, Record{}, Response{Status: 201, Header: header, Body: []byte(`{"id":1}`), BodyKind: BodyJSON})
		}},
		{"raw", func(f Fence) error {
			return s.Complete(ctx, f, Record{}, Response{Status: 200, Body: []byte("\x00bin"), BodyKind: BodyRaw})
		}},
		{"json kept raw", func(f Fence) error {
			return s.Complete(ctx, f, Record{}, Response{Status: 200, Header: header, Body: []byte(`{"a":"\u0000"}`), BodyKind: BodyJSON})
		}},
		{"not stored", func(f Fence) error { return s.Complete(ctx, f, Record{}, Response{Status: 202, BodyKind: BodyNone}) }},
		{"sealed", func(f Fence) error {
			return s.Complete(ctx, f, Record{}, Response{Status: 201, Body: []byte("\x01sealed"), BodyKind: BodyRaw, SealKeyID: "k1"})
		}},
		{"failed", func(f Fence) error { return s.Fail(ctx, f) }},
	} {
		req := ClaimRequest{Key: uuid.NewString(), Scope: "u1", Endpoint: "orders",
			RequestHash: "ab", TTL: time.Hour, Lease: time.Minute, Owner: uuid.New()}
		// The new key's claim: its row from the INSERT.
		var first Record
		var firstWon bool
		rows, err := pool.Query(ctx, pgsql.ClaimSQL, claimArgs(req)...)
		if err == nil {
			err = scanClaimRows(rows, req, &first, &firstWon)
		}
		if err != nil || !firstWon || first.Status != StatusInFlight || first.ID == 0 {
			t.Fatalf("%s: new claim: won %v, %+v, %v", shape.name, firstWon, first, err)
		}
		if err := shape.settle(first.Fence()); err != nil {
			t.Fatalf("%s: settle: %v", shape.name, err)
		}
		// The existing row, read both ways.
		var want, got Record
		var wantWon, gotWon bool
		wantErr := scanClaim(pool.QueryRow(ctx, pgsql.ClaimSQL, claimArgs(req)...), req, &want, &wantWon)
		rows, err = pool.Query(ctx, pgsql.ClaimSQL, claimArgs(req)...)
		if err != nil {
			t.Fatal(err)
		}
		if !rows.Next() {
			t.Fatalf("%s: no row: %v", shape.name, rows.Err())
		}
		var v rowValues
		var rec Record
		var won bool
		if decoded := decodeClaimRow(rows, &rec, &v, &won); decoded != decodes {
			t.Errorf("%s: decodeClaimRow decoded %v, want %v", shape.name, decoded, decodes)
		}
		rows.Close()
		rows, err = pool.Query(ctx, pgsql.ClaimSQL, claimArgs(req)...)
		if err == nil {
			err = scanClaimRows(rows, req, &got, &gotWon)
		}
		if err != nil || wantErr != nil || gotWon != wantWon || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: scanClaimRows = %v, %+v, %v\n pgx scan gives %v, %+v, %v", shape.name, gotWon, got, err, wantWon, want, wantErr)
		}
		if shape.name == "in flight" && (!reflect.DeepEqual(first, want) || !wantWon) {
			t.Errorf("the new claim's row %+v; read again %+v (won %v)", first, want, wantWon)
		}
	}
}
