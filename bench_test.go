package idempotency_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/jackc/pgx/v5/pgxpool"
)

// discardWriter is a ResponseWriter that keeps only the status and the
// headers, so benchmarks time the middleware rather than a recorder.
type discardWriter struct {
	h    http.Header
	code int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(code int)        { d.code = code }

// check fails the benchmark unless the answer was the handler's 201, a
// replay or not as replayed says; then readies d for the next round.
func (d *discardWriter) check(b *testing.B, replayed bool) {
	if d.code != http.StatusCreated || (d.h.Get(idempotency.HeaderReplayed) == "true") != replayed {
		b.Fatalf("answered %d, %s %q; want 201, replayed %v", d.code, idempotency.HeaderReplayed, d.h.Get(idempotency.HeaderReplayed), replayed)
	}
	d.code = 0
	clear(d.h)
}

func benchRoute(b *testing.B) http.Handler {
	mw := newMiddleware(b, idempotency.NewMemoryStore(), idempotency.Config{})
	return mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1,"symbol":"AAPL","side":"buy","qty":10,"status":"filled","fill_price":187.42}`))
	}))
}

const benchBody = `{"symbol":"AAPL","side":"buy","qty":10}`

// benchRequest builds the request once; next readies it for another round
// (a fresh body, and the key), so the loop times the middleware rather
// than request parsing.
type benchRequest struct {
	r    *http.Request
	body strings.Reader
}

func newBenchRequest() *benchRequest {
	br := &benchRequest{r: httptest.NewRequest("POST", "/api/trading/orders", nil)}
	br.r.ContentLength = int64(len(benchBody))
	return br
}

func (br *benchRequest) next(key string) *http.Request {
	br.body.Reset(benchBody)
	br.r.Body = io.NopCloser(&br.body)
	if key == "" {
		br.r.Header.Del(idempotency.HeaderKey)
	} else {
		br.r.Header.Set(idempotency.HeaderKey, key)
	}
	return br.r
}

// BenchmarkPassthrough is a request without a key: the floor.
func BenchmarkPassthrough(b *testing.B) {
	rt, w, br := benchRoute(b), &discardWriter{h: http.Header{}}, newBenchRequest()
	b.ReportAllocs()
	for b.Loop() {
		rt.ServeHTTP(w, br.next(""))
		w.check(b, false)
	}
}

// BenchmarkMiss is a new key every time: claim, run, record, send.
func BenchmarkMiss(b *testing.B) {
	rt, w, br := benchRoute(b), &discardWriter{h: http.Header{}}, newBenchRequest()
	keys := make([]string, b.N+1) // fresh keys, made outside the timed loop
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		rt.ServeHTTP(w, br.next(keys[i]))
		w.check(b, false)
	}
}

// BenchmarkReplay is one key replayed.
func BenchmarkReplay(b *testing.B) {
	rt, w, br := benchRoute(b), &discardWriter{h: http.Header{}}, newBenchRequest()
	key := uuid.NewString()
	rt.ServeHTTP(w, br.next(key))
	w.check(b, false)
	b.ReportAllocs()
	for b.Loop() {
		rt.ServeHTTP(w, br.next(key))
		w.check(b, true)
	}
}

const benchOrder = `{"symbol":"AAPL","side":"buy","qty":10}`

// What the benchmark handler answers, as the middleware records it.
var (
	orderResponse = []byte(`{"id":1,"symbol":"AAPL","side":"buy","qty":10,"status":"filled","fill_price":187.42}`)
	orderRecord   = idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
		Body: orderResponse, BodyKind: idempotency.BodyJSON}
)

// The claim the middleware makes for a benchmark request, but for the key.
var orderClaim = idempotency.ClaimRequest{Endpoint: "orders",
	RequestHash: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", TTL: 24 * time.Hour, Lease: 30 * time.Second}

// benchPool is a migrated schema's pool, warmed: every connection open and
// the store's claim and complete statements prepared on each, so the timer
// never pays for a connection's or a statement's setup.
func benchPool(b *testing.B) *pgxpool.Pool {
	pool := testdb.New(b, testdb.MaxConns(8))
	warm(b, pool)
	return pool
}

// warm opens every connection pool may hold and prepares the store's claim
// and complete statements on each (pgx then uses them for the same SQL).
func warm(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), 30*time.Second)
	defer cancel()
	conns := make([]*pgxpool.Conn, 0, pool.Config().MaxConns)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range cap(conns) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			b.Fatalf("warm the pool: %v", err)
		}
		conns = append(conns, c)
		for _, sql := range []string{idempotency.ClaimSQLForTest, idempotency.CompleteSQLForTest} {
			if _, err := c.Conn().Prepare(ctx, sql, sql); err != nil {
				b.Fatalf("warm the pool: prepare: %v", err)
			}
		}
	}
}

func benchMiddleware(b *testing.B, pool *pgxpool.Pool) http.Handler {
	mw := newMiddleware(b, idempotency.NewPostgresStore(pool), idempotency.Config{})
	return mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(orderResponse)
	}))
}

// client is one benchmark goroutine's request, reused every round, and a
// writer that keeps only the status: the loop times the middleware and the
// database, not request parsing.
type client struct {
	r    *http.Request
	body strings.Reader
	w    discardWriter
}

func newClient() *client {
	c := &client{r: httptest.NewRequest("POST", "/api/trading/orders", nil), w: discardWriter{h: http.Header{}}}
	c.r.ContentLength = int64(len(benchOrder))
	return c
}

func (c *client) serve(b *testing.B, h http.Handler, key string) {
	c.body.Reset(benchOrder)
	c.r.Body = io.NopCloser(&c.body)
	c.r.Header.Set(idempotency.HeaderKey, key)
	clear(c.w.h)
	c.w.code = 0
	h.ServeHTTP(&c.w, c.r)
	if c.w.code != http.StatusCreated {
		b.Errorf("status %d", c.w.code)
	}
}

func BenchmarkPostgresMiss(b *testing.B) {
	h := benchMiddleware(b, benchPool(b))
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(8) // 16 clients on 2 cores, as the load tests use
	b.RunParallel(func(pb *testing.PB) {
		c := newClient()
		for pb.Next() {
			c.serve(b, h, uuid.NewString())
		}
	})
}

func BenchmarkPostgresReplay(b *testing.B) {
	h := benchMiddleware(b, benchPool(b))
	key := uuid.NewString()
	newClient().serve(b, h, key)
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		c := newClient()
		for pb.Next() {
			c.serve(b, h, key)
		}
	})
}

// rawClaim sends the claim statement, with the parameters the store sends,
// and reads the row the way the store does not need to: only id, attempt
// and won.
func rawClaim(ctx context.Context, pool *pgxpool.Pool, key string) (id int64, attempt int32, won bool, err error) {
	req := orderClaim
	req.Key = key
	rows, err := pool.Query(ctx, idempotency.ClaimSQLForTest, idempotency.ClaimArgsForTest(req)...)
	if err != nil {
		return 0, 0, false, err
	}
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return 0, 0, false, err
		}
		id, attempt, won = vals[0].(int64), vals[3].(int32), vals[len(vals)-1].(bool)
	}
	return id, attempt, won, rows.Err()
}

// rawComplete sends the complete statement with the parameters the store
// sends for orderRecord; complete is those parameters, made once, for any
// fence, which is the row's id and attempt ($1, $2) and its key ($9; the
// scope and endpoint are orderClaim's).
func rawComplete(ctx context.Context, pool *pgxpool.Pool, complete []any, key string, id int64, attempt int32) error {
	args := slices.Clone(complete)
	args[0], args[1], args[8] = id, attempt, key
	tag, err := pool.Exec(ctx, idempotency.CompleteSQLForTest, args...)
	if err == nil && tag.RowsAffected() != 1 {
		err = idempotency.ErrNotOwner
	}
	return err
}

func completeArgs(b *testing.B) []any {
	args, err := idempotency.CompleteArgsForTest(idempotency.Fence{Scope: orderClaim.Scope, Endpoint: orderClaim.Endpoint}, orderRecord)
	if err != nil {
		b.Fatal(err)
	}
	return args
}

func BenchmarkPostgresRawMiss(b *testing.B) {
	pool := benchPool(b)
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute) // a bound, never reached by a healthy run
	defer cancel()
	complete := completeArgs(b)
	var fails atomic.Int64
	var lastErr atomic.Value
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(8) // 16 clients on 2 cores, as the load tests use
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := uuid.NewString()
			id, attempt, won, err := rawClaim(ctx, pool, key)
			if err == nil && won {
				err = rawComplete(ctx, pool, complete, key, id, attempt)
			} else if err == nil {
				err = errors.New("a new key's claim lost")
			}
			if err != nil {
				fails.Add(1)
				lastErr.Store(err)
			}
		}
	})
	if fails.Load() > 0 {
		b.Fatalf("%d raw claims failed, the last: %v", fails.Load(), lastErr.Load())
	}
}

func BenchmarkPostgresRawReplay(b *testing.B) {
	pool := benchPool(b)
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute) // a bound, never reached by a healthy run
	defer cancel()
	key := uuid.NewString()
	// A completed key with the same response the middleware records, so
	// both sides read the same row.
	id, attempt, won, err := rawClaim(ctx, pool, key)
	if err != nil || !won {
		b.Fatalf("claim: won %v, %v", won, err)
	}
	if err := rawComplete(ctx, pool, completeArgs(b), key, id, attempt); err != nil {
		b.Fatal(err)
	}
	var fails atomic.Int64
	var lastErr atomic.Value
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(8) // 16 clients on 2 cores, as the load tests use
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _, won, err := rawClaim(ctx, pool, key)
			if err == nil && won {
				err = errors.New("a completed key's claim won")
			}
			if err != nil {
				fails.Add(1)
				lastErr.Store(err)
			}
		}
	})
	if fails.Load() > 0 {
		b.Fatalf("%d raw replays failed, the last: %v", fails.Load(), lastErr.Load())
	}
}

// benchResponse is a typical order response.
var benchResponse = idempotency.Response{
	Status:   201,
	Header:   http.Header{"Content-Type": {"application/json"}, "Location": {"/api/trading/orders/42"}},
	Body:     []byte(`{"id":42,"symbol":"AAPL","side":"buy","qty":10,"status":"filled","fill_price":187.25}`),
	BodyKind: idempotency.BodyJSON,
}

// BenchmarkPostgresClaimComplete measures the winner's path of the raw
// store: Claim of a new key, then Complete.
func BenchmarkPostgresClaimComplete(b *testing.B) {
	pool := testdb.New(b, testdb.MaxConns(16))
	warm(b, pool)
	s := idempotency.NewPostgresStore(pool)
	hash := strings.Repeat("ab", 32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			res, err := s.Claim(ctx, idempotency.ClaimRequest{
				Key: uuid.NewString(), Scope: "bench", Endpoint: "POST /api/trading/orders",
				RequestHash: hash, TTL: 24 * time.Hour, Lease: 30 * time.Second,
			})
			if err != nil || !res.Won {
				b.Fatalf("Claim: won %v err %v", res.Won, err)
			}
			if err := s.Complete(ctx, res.Record.Fence(), res.Record, benchResponse); err != nil {
				b.Fatalf("Complete: %v", err)
			}
		}
	})
}

// BenchmarkPostgresClaimReplay measures the loser's path: Claim of a key
// that is already completed, as every replay does.
func BenchmarkPostgresClaimReplay(b *testing.B) {
	pool := testdb.New(b, testdb.MaxConns(16))
	warm(b, pool)
	s := idempotency.NewPostgresStore(pool)
	req := idempotency.ClaimRequest{
		Key: uuid.NewString(), Scope: "bench", Endpoint: "POST /api/trading/orders",
		RequestHash: strings.Repeat("ab", 32), TTL: 24 * time.Hour, Lease: 30 * time.Second,
	}
	res, err := s.Claim(b.Context(), req)
	if err != nil || !res.Won {
		b.Fatalf("Claim: won %v err %v", res.Won, err)
	}
	if err := s.Complete(b.Context(), res.Record.Fence(), res.Record, benchResponse); err != nil {
		b.Fatalf("Complete: %v", err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			res, err := s.Claim(ctx, req)
			if err != nil || res.Won || res.Record.Status != idempotency.StatusCompleted {
				b.Fatalf("replay Claim: won %v status %s err %v", res.Won, res.Record.Status, err)
			}
		}
	})
}
