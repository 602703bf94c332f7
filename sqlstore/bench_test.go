package sqlstore_test

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/sqlstore"
)

// benchConns is each benchmark pool's size: 16 clients share 8 connections (the shared PostgreSQL server has little room left).
const benchConns = 8

var benchBody = `{"symbol":"AAPL","side":"buy","qty":10}`

// benchRoute is the ordinary order route over s, answering 201 with a JSON
// order.
func benchRoute(b *testing.B, s idempotency.Store) http.Handler {
	mw := newMiddleware(b, s, idempotency.Config{})
	route, err := mw.Route(idempotency.RouteConfig{})
	if err != nil {
		b.Fatal(err)
	}
	return route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":1,"symbol":"AAPL","status":"filled"}`)
	}))
}

// benchServe sends one order with key through h.
func benchServe(b *testing.B, h http.Handler, key string) {
	r := httptest.NewRequest(http.MethodPost, "/api/trading/orders", strings.NewReader(benchBody))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		b.Errorf("status %d: %s", w.Code, w.Body)
	}
}

// benchParallel runs new keys or replays of one key on h from 16 clients.
func benchParallel(b *testing.B, h http.Handler, replay bool) {
	key := uuid.NewString()
	benchServe(b, h, key)
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(8) // 16 clients on 2 cores, as the root's benchmarks
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := key
			if !replay {
				k = uuid.NewString()
			}
			benchServe(b, h, k)
		}
	})
}

// BenchmarkPostgresStores: the same ordinary order route on the pgx store
// and on the database/sql store (pgx's stdlib driver), over one schema,
// 16 clients, new keys and replays. Each client alternates a request to
// each store (in alternating order), so both see the same machine at the
// same moment, and each store's time per request is summed apart:
// "ratio" is the database/sql store's throughput over the pgx store's.
func BenchmarkPostgresStores(b *testing.B) {
	dsn := testdb.NewDSN(b)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = benchConns
	pool, err := pgxpool.NewWithConfig(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(benchConns)
	db.SetMaxIdleConns(benchConns)
	b.Cleanup(func() { _ = db.Close() })
	routes := [2]http.Handler{benchRoute(b, idempotency.NewPostgresStore(pool)), benchRoute(b, pgStore(b, db))}
	for _, kind := range []string{"new", "replay"} {
		b.Run(kind, func(b *testing.B) { benchSideBySide(b, routes, kind == "replay", "pgx", "sql") })
	}
}

// benchSideBySide alternates routes[0] and routes[1] in every client;
// "ratio" is routes[1]'s throughput over routes[0]'s.
func benchSideBySide(b *testing.B, routes [2]http.Handler, replay bool, name0, name1 string) {
	var keys [2]string
	for i, h := range routes {
		keys[i] = uuid.NewString()
		benchServe(b, h, keys[i])
	}
	var spent [2]atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(8) // 16 clients on 2 cores, as the root's benchmarks
	b.RunParallel(func(pb *testing.PB) {
		for n := 0; pb.Next(); n++ {
			for j := range 2 {
				i := (n + j) % 2
				k := keys[i]
				if !replay {
					k = uuid.NewString()
				}
				start := time.Now()
				benchServe(b, routes[i], k)
				spent[i].Add(int64(time.Since(start)))
			}
		}
	})
	t0, t1 := float64(spent[0].Load()), float64(spent[1].Load())
	b.ReportMetric(t0/float64(b.N), name0+"-ns/req")
	b.ReportMetric(t1/float64(b.N), name1+"-ns/req")
	b.ReportMetric(t0/t1, "ratio")
}

// BenchmarkMySQLFloor: on MariaDB, the store's claim and complete of a
// new key (INSERT, the read of the new row, the fenced UPDATE) beside the
// floor of the same SQL sent raw (the INSERT and the UPDATE alone), and
// the ordinary route on the store, 16 clients each.
func BenchmarkMySQLFloor(b *testing.B) {
	d := newMySQLDB(b)
	s := d.store(b, benchConns)
	raw := d.open(b, benchConns)
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute) // a bound, never reached by a healthy run
	defer cancel()
	resp := idempotency.Response{Status: 201, BodyKind: idempotency.BodyJSON, Body: []byte(`{"id":1,"symbol":"AAPL","status":"filled"}`),
		Header: http.Header{"Content-Type": {"application/json"}}}
	table := "`" + d.name + "`.`idempotency_keys`"
	insert := `INSERT INTO ` + table + ` (idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	 created_at, locked_at, locked_until, expires_at, owner_token)
VALUES (?, ?, ?, ?, 'in_flight', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?)`
	complete := `UPDATE ` + table + ` SET status = 'completed',
	response_code = ?, response_body = ?, response_body_raw = ?, response_headers = ?, seal_key_id = ?
WHERE id = ? AND scope_user_id = ? AND status = 'in_flight' AND attempt = ?`
	run := func(b *testing.B, f func() error) {
		b.ReportAllocs()
		b.ResetTimer()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := f(); err != nil {
					b.Error(err)
				}
			}
		})
	}
	b.Run("raw", func(b *testing.B) {
		run(b, func() error {
			req := idempotencytest.Request("user-1", time.Hour, 30*time.Second)
			r, err := raw.ExecContext(ctx, insert, req.Key, req.Scope, req.Endpoint, req.RequestHash,
				req.Lease.Microseconds(), req.TTL.Microseconds(), nil)
			if err != nil {
				return err
			}
			id, _ := r.LastInsertId()
			_, err = raw.ExecContext(ctx, complete, 201, string(resp.Body), nil, `{"Content-Type":["application/json"]}`, nil, id, req.Scope, 1)
			return err
		})
	})
	b.Run("store", func(b *testing.B) {
		run(b, func() error {
			req := idempotencytest.Request("user-1", time.Hour, 30*time.Second)
			res, err := s.Claim(ctx, req)
			if err != nil {
				return err
			}
			return s.Complete(ctx, res.Record.Fence(), res.Record, resp)
		})
	})
	b.Run("route-new", func(b *testing.B) { benchParallel(b, benchRoute(b, s), false) })
	b.Run("route-replay", func(b *testing.B) { benchParallel(b, benchRoute(b, s), true) })
	// The transactional order route (one order row written through the
	// lent Tx) with the middleware on, against the kill-switch off (the
	// handler still gets its transaction), alternated in every client:
	// "ratio" is on's throughput over off's.
	exec(b, raw, "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, symbol VARCHAR(16) NOT NULL) ENGINE=InnoDB")
	b.Run("order-on-off", func(b *testing.B) {
		benchSideBySide(b, [2]http.Handler{benchOrderRoute(b, s, false), benchOrderRoute(b, s, true)}, false, "off", "on")
	})
}

// benchOrderRoute is a transactional order route over s writing one row;
// enabled false is the kill-switch off.
func benchOrderRoute(b *testing.B, s idempotency.Store, enabled bool) http.Handler {
	mw := newMiddleware(b, s, idempotency.Config{Enabled: func(context.Context) bool { return enabled }})
	route, err := mw.Route(idempotency.RouteConfig{Transactional: true})
	if err != nil {
		b.Fatal(err)
	}
	return route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := sqlstore.TxFromContext(r.Context())
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (symbol) VALUES ('AAPL')"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
}
