package main

// The floor (-floor, bench/load.sh's subject N0): the same route, the same
// pool and the same statements as N, without the middleware. A request
// with a new key runs the claim, then the complete, then answers 201; a
// request for a completed key runs the claim and answers the stored
// response with Idempotent-Replayed: true. No request hash, no recorder,
// no decoding beyond the columns the answer needs: what is left is
// net/http, pgx and the SQL, the least a route that stores its answers in
// PostgreSQL could cost on this machine; N over N0 is what the middleware
// and the store add to it.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/bench/internal/gosrc"
	"github.com/idemkit/idempotency/migrations"
)

// floorSQL are the store's own statements the floor runs, read out of the
// root module's internal/pgsql/pgsql.go (an internal package) when it starts, so
// the floor always runs what the middleware runs: pgClaimSQL and
// pgCompleteSQL.
type floorSQL struct{ claim, complete string }

// loadFloorSQL reads the statements from the file at src.
func loadFloorSQL(src string) (floorSQL, error) {
	consts, err := gosrc.StringConsts(src)
	if err != nil {
		return floorSQL{}, err
	}
	q := floorSQL{claim: consts["pgClaimSQL"], complete: consts["pgCompleteSQL"]}
	if q.claim == "" || q.complete == "" {
		return floorSQL{}, fmt.Errorf("%s: pgClaimSQL or pgCompleteSQL not found", src)
	}
	return q, nil
}

// qualified returns q naming the table schema-qualified, as the store
// sends its statements (store_pg_pool.go): where the pool's search_path
// finds it.
func (q floorSQL) qualified(ctx context.Context, pool *pgxpool.Pool) (floorSQL, error) {
	var table string
	if err := pool.QueryRow(ctx, `SELECT format('%s.%I', relnamespace::regnamespace, relname)
		FROM pg_class WHERE oid = to_regclass('idempotency_keys')`).Scan(&table); err != nil {
		return floorSQL{}, fmt.Errorf("resolve the table: %w", err)
	}
	return floorSQL{tableName.ReplaceAllLiteralString(q.claim, table), tableName.ReplaceAllLiteralString(q.complete, table)}, nil
}

// tableName matches the table's name in the store's statements.
var tableName = regexp.MustCompile(`\bidempotency_keys\b`)

// The claim's parameters the middleware derives and the floor fixes: a
// request hash (the floor hashes nothing; the value is the one load.sh
// gives pgbench), and the default TTL and lease (idempotency.Config).
const (
	floorHash  = "5f1e3d0b9c8a7f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291807f6e"
	floorTTL   = 24 * time.Hour
	floorLease = 30 * time.Second
)

// The claim row's columns the floor reads (pgClaimColumns, then won).
const (
	colID       = 0
	colStatus   = 2
	colAttempt  = 3
	colCode     = 4
	colBody     = 5
	colHeaders  = 7
	colWon      = 17 // after seal_key_id (8), which the floor never sets, derive_key_id (13) and the tombstone flag (16)
	claimFields = 18
)

// newFloorHandler migrates and checks the schema as newHandler does, and
// returns the floor's routes: the same paths, no middleware.
func newFloorHandler(ctx context.Context, pool *pgxpool.Pool, sqlSrc string) (http.Handler, error) {
	q, err := loadFloorSQL(sqlSrc)
	if err != nil {
		return nil, err
	}
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := migrations.Migrate(mctx, pool); err != nil {
		return nil, err
	}
	if err := idempotency.NewPostgresStore(pool).Check(mctx); err != nil {
		return nil, err
	}
	if q, err = q.qualified(mctx, pool); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(routePattern, floor{pool, q})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	return mux, nil
}

// floor is the route by hand.
type floor struct {
	pool *pgxpool.Pool
	sql  floorSQL
}

// claimed is what the floor reads of the claim's row.
type claimed struct {
	won           bool
	id            int64
	attempt       int32
	status        string
	code          int
	body, headers []byte
}

var (
	answerBytes       = []byte(answerBody)
	answerHeaderBytes = []byte(answerHeaders)
)

func (f floor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	// The middleware reads the body before the claim (to hash it).
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		http.Error(w, "reading the body", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	c, err := f.claim(ctx, key)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	switch {
	case c.won:
		// The handler's answer, recorded before it is sent, as the
		// middleware does.
		tag, err := f.pool.Exec(ctx, f.sql.complete, c.id, c.attempt, scope, http.StatusCreated,
			answerBytes, []byte(nil), answerHeaderBytes, nil, key, routePattern)
		if err == nil && tag.RowsAffected() != 1 {
			err = errors.New("complete: not the owner")
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		noop(w, r)
	case c.status == "completed":
		h := w.Header()
		if string(c.headers) == answerHeaders {
			h["Content-Type"] = []string{"application/json"}
		} else if err := json.Unmarshal(c.headers, &h); err != nil {
			http.Error(w, "stored headers: "+err.Error(), http.StatusInternalServerError)
			return
		}
		h[idempotency.HeaderReplayed] = []string{"true"}
		w.WriteHeader(c.code)
		_, _ = w.Write(c.body)
	default:
		http.Error(w, "in flight or failed: "+c.status, http.StatusConflict)
	}
}

// claim runs the claim for key and reads its one row.
func (f floor) claim(ctx context.Context, key string) (claimed, error) {
	rows, err := f.pool.Query(ctx, f.sql.claim, key, scope, routePattern, floorHash, floorTTL, floorLease, uuid.NewString(), "", time.Duration(0))
	if err != nil {
		return claimed{}, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return claimed{}, err
		}
		return claimed{}, errors.New("claim: no row (a concurrent commit; the store would run it again)")
	}
	c, err := decodeClaimed(rows.FieldDescriptions(), rows.RawValues())
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	return c, err
}

// errColumn is a claim row the floor does not read (the store would have
// pgx scan it): another type or format than pgx's defaults give.
var errColumn = errors.New("claim row: unexpected column type or format")

// decodeClaimed reads the columns the answer needs from the claim's row,
// in pgx's default formats: integers, booleans and bytea binary, text as
// text.
func decodeClaimed(fields []pgconn.FieldDescription, values [][]byte) (claimed, error) {
	var c claimed
	if len(fields) != claimFields || len(values) != claimFields {
		return c, errColumn
	}
	bin := func(i int, n int) ([]byte, bool) {
		v := values[i]
		return v, fields[i].Format == pgtype.BinaryFormatCode && len(v) == n
	}
	v, ok := bin(colWon, 1)
	if !ok {
		return c, errColumn
	}
	c.won = v[0] == 1
	if v, ok = bin(colID, 8); !ok {
		return c, errColumn
	}
	c.id = int64(binary.BigEndian.Uint64(v))
	if v, ok = bin(colAttempt, 4); !ok {
		return c, errColumn
	}
	c.attempt = int32(binary.BigEndian.Uint32(v))
	c.status = string(values[colStatus])
	if c.won || c.status != "completed" {
		return c, nil
	}
	if v, ok = bin(colCode, 2); !ok {
		return c, errColumn
	}
	c.code = int(int16(binary.BigEndian.Uint16(v)))
	var err error
	if c.body, err = byteaValue(fields[colBody], values[colBody]); err != nil {
		return c, err
	}
	c.headers, err = byteaValue(fields[colHeaders], values[colHeaders])
	return c, err
}

// byteaValue copies a binary bytea value (NULL as nil).
func byteaValue(f pgconn.FieldDescription, v []byte) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	if f.Format != pgtype.BinaryFormatCode {
		return nil, errColumn
	}
	return append([]byte(nil), v...), nil
}
