package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/idemkit/idempotency/internal/testdb"
)

// Group commit (store_pg_batch.go): every key executes once whatever its
// batch, a value the store refuses and a caller that gave up never fail
// their neighbours, a batch whose reply is lost or comes too late leaves no
// claim without a caller, and a process killed with batches in flight
// executes no key twice.

// batchCounter counts the batch statements pgx sends (a BatchTracer), and
// the rounds: pgx batches that carry both a claim and a record statement.
type batchCounter struct{ claims, records, rounds atomic.Int64 }

func (c *batchCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *batchCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *batchCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var claims, records bool
	for _, q := range d.Batch.QueuedQueries {
		claims = claims || strings.Contains(q.SQL, "in_grace")
		records = records || strings.Contains(q.SQL, "in_seal")
	}
	if claims && records {
		c.rounds.Add(1)
	}
	return ctx
}
func (c *batchCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
func (c *batchCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	switch {
	case strings.Contains(d.SQL, "in_grace"):
		c.claims.Add(1)
	case strings.Contains(d.SQL, "in_seal"):
		c.records.Add(1)
	}
}

func (c *batchCounter) option() testdb.Option {
	return testdb.Configure(func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = c })
}

// batchedStore is a PostgresStore on pool with one batch slot, so that
// calls queue behind one that holds it.
func batchedStore(t *testing.T, pool *pgxpool.Pool) *idempotency.PostgresStore {
	t.Helper()
	s := idempotency.NewPostgresStore(pool)
	if err := s.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.SetBatching(32, 1)
	return s
}

// holdSlot makes s's one claim slot busy: an open transaction inserts a
// key's row, and a claim of that key through s waits on the row's lock. The
// returned function rolls the transaction back (the waiting claim then
// wins the key) and waits for that claim's answer.
func holdSlot(t *testing.T, pool *pgxpool.Pool, s *idempotency.PostgresStore) (free func()) {
	t.Helper()
	blocker, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := blocker.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	req := slotClaim(uuid.NewString())
	if _, err := tx.Exec(t.Context(), `INSERT INTO idempotency_keys (idem_key, scope_endpoint, request_hash, locked_until, expires_at)
		VALUES ($1, $2, '', now(), now())`, req.Key, req.Endpoint); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		res, err := s.Claim(context.Background(), req)
		if err == nil && !res.Won {
			err = fmt.Errorf("lost: %+v", res)
		}
		done <- err
	}()
	waitBlockedTree(t, pool, blocker.Conn().PgConn().PID(), 1)
	return func() {
		_ = tx.Rollback(context.Background())
		blocker.Release()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the claim holding the slot: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("the claim holding the slot never returned")
		}
	}
}

// waitQueued polls s until n claims are queued (condition polling).
func waitQueued(t *testing.T, s *idempotency.PostgresStore, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if got, _ := idempotency.QueuedForTest(s); got == n {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("%d claims queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// slotClaim is a claim of key on POST /orders.
func slotClaim(key string) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Key: key, Endpoint: "POST /orders", RequestHash: strings.Repeat("ab", 32),
		TTL: time.Hour, Lease: time.Minute, Owner: uuid.New()}
}

// TestGroupCommitStorm: 100 keys, 16 copies of each at once, through one
// middleware and through two (two pools): every key executes once, every
// copy gets a fresh 201, a replay or 409 in flight, and claims and records
// went through batches.
func TestGroupCommitStorm(t *testing.T) {
	t.Parallel()
	var bc batchCounter
	dsn := testdb.NewDSN(t)
	var calls atomic.Int64
	var handlers []http.Handler
	for range 2 {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns, cfg.ConnConfig.Tracer, cfg.ConnConfig.ConnectTimeout = 8, &bc, 10*time.Second
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		h, _ := pgRoute(t, pool, raceConfig, idempotency.RouteConfig{Name: "orders"}, &calls)
		handlers = append(handlers, h)
	}
	keys := newKeys(100)
	race(t, handlers, keys, 16)
	if calls.Load() != int64(len(keys)) {
		t.Fatalf("executions = %d, want %d", calls.Load(), len(keys))
	}
	if bc.claims.Load() == 0 {
		t.Fatal("no claim went through a batch")
	}
	t.Logf("%d claim batches, %d record batches", bc.claims.Load(), bc.records.Load())
}

// TestGroupCommitNeighbours: one batch holds five new keys, two more calls
// for the first of them, a request hash the database refuses (the batch
// fails, each call is retried alone) and a caller that gave up while
// queued: the five win, the two copies lose to the first's row, the
// refused value fails alone as data, and the one that gave up is answered
// at once without its claim ever being sent.
func TestGroupCommitNeighbours(t *testing.T) {
	t.Parallel()
	for _, refused := range []bool{false, true} {
		t.Run(fmt.Sprintf("refused=%v", refused), func(t *testing.T) {
			t.Parallel()
			var bc batchCounter
			pool := testdb.New(t, testdb.MaxConns(8), bc.option())
			s := batchedStore(t, pool)
			free := holdSlot(t, pool, s)
			type answer struct {
				i   int
				res idempotency.ClaimResult
				err error
			}
			reqs := make([]idempotency.ClaimRequest, 0, 8)
			for range 5 {
				reqs = append(reqs, slotClaim(uuid.NewString()))
			}
			for range 2 {
				dup := reqs[0]
				dup.Owner = uuid.New()
				reqs = append(reqs, dup)
			}
			if refused {
				bad := slotClaim(uuid.NewString())
				bad.RequestHash = "zz" // not hex: decode() fails, 22023
				reqs = append(reqs, bad)
			}
			answers := make(chan answer, len(reqs)+1)
			for i, r := range reqs {
				go func() {
					res, err := s.Claim(context.Background(), r)
					answers <- answer{i, res, err}
				}()
			}
			waitQueued(t, s, len(reqs))
			gaveUp, cancel := context.WithCancel(context.Background())
			go func() {
				_, err := s.Claim(gaveUp, slotClaim(uuid.NewString()))
				answers <- answer{-1, idempotency.ClaimResult{}, err}
			}()
			waitQueued(t, s, len(reqs)+1)
			cancel()
			if a := <-answers; a.i != -1 || !errors.Is(a.err, context.Canceled) {
				t.Fatalf("the caller that gave up: %+v, want its own context's error at once", a)
			}
			free()
			got := make([]answer, len(reqs))
			for range reqs {
				select {
				case a := <-answers:
					got[a.i] = a
				case <-time.After(time.Minute):
					t.Fatal("a batched claim never returned")
				}
			}
			// Key 0 has three calls (0, 5, 6): the first queued of them
			// leads, wins, and the other two lose to its row.
			winners := 0
			var row int64
			for i, a := range got {
				switch {
				case refused && i == len(reqs)-1:
					var se *idempotency.StoreError
					if !errors.As(a.err, &se) || se.Reason != idempotency.ReasonData {
						t.Errorf("the refused value: %+v %v, want a data error", a.res, a.err)
					}
				case i > 0 && i < 5:
					if a.err != nil || !a.res.Won {
						t.Errorf("new key %d: %+v %v, want won", i, a.res, a.err)
					}
				case a.err != nil:
					t.Errorf("call %d for key 0: %v", i, a.err)
				case row != 0 && a.res.Record.ID != row:
					t.Errorf("call %d for key 0 read row %d, another read %d", i, a.res.Record.ID, row)
				default:
					row = a.res.Record.ID
					if a.res.Won {
						winners++
					}
				}
			}
			if winners != 1 {
				t.Errorf("%d of the three calls for key 0 won, want 1", winners)
			}
			if bc.claims.Load() != 1 {
				t.Errorf("%d claim batches, want 1", bc.claims.Load())
			}
		})
	}
}

// TestGroupCommitDistributed: Check's Citus query, and the switch it
// throws: a distributed table turns batching off, a plain one leaves it.
func TestGroupCommitDistributed(t *testing.T) {
	for _, want := range []string{"pg_extension", "extname = 'citus'"} {
		if !strings.Contains(pgsql.CitusSQL, want) {
			t.Fatalf("CitusSQL lacks %q:\n%s", want, pgsql.CitusSQL)
		}
	}
	if !strings.Contains(pgsql.CitusTableSQL, "pg_dist_partition WHERE logicalrelid = to_regclass($1)") {
		t.Fatalf("CitusTableSQL:\n%s", pgsql.CitusTableSQL)
	}
	s := idempotency.NewPostgresStore(testdb.New(t))
	if max, slots := idempotency.BatchingForTest(s); max != 32 || slots != 1 {
		t.Fatalf("defaults: %d, %d; want 32, 1", max, slots)
	}
	idempotency.DistributedForTest(s, false)
	if max, _ := idempotency.BatchingForTest(s); max == 0 {
		t.Fatal("a plain table turned batching off")
	}
	idempotency.DistributedForTest(s, true)
	if max, slots := idempotency.BatchingForTest(s); max != 0 || slots != 0 {
		t.Fatalf("a distributed table left batching on: %d, %d", max, slots)
	}
}

// replyHolder holds the server's whole reply to chosen statements until
// release is closed: the server has run and committed the batch, its
// caller hears of it late.
type replyHolder struct {
	marker  []byte
	release chan struct{}
	held    atomic.Int32
}

func (rh *replyHolder) option() testdb.Option {
	return testdb.Configure(func(c *pgxpool.Config) {
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &holdConn{Conn: conn, rh: rh}, nil
		}
	})
}

type holdConn struct {
	net.Conn
	rh      *replyHolder
	armed   atomic.Bool
	pending []byte
}

func (c *holdConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, c.rh.marker) {
		c.armed.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *holdConn) Read(b []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	if !c.armed.CompareAndSwap(true, false) {
		return c.Conn.Read(b)
	}
	c.pending = readReply(c.Conn)
	c.rh.held.Add(1)
	<-c.rh.release
	n := copy(b, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// TestGroupCommitLostReply: a batch of eight new keys whose reply is lost
// after the server committed it (the connection cut), and one whose reply
// comes after every caller's deadline. Each caller is answered 503 by its
// class, each key's row is given back by its owner token (none stays in
// flight without a caller), and the retries then execute each key once.
func TestGroupCommitLostReply(t *testing.T) {
	t.Parallel()
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "cut", true: "late"}[late], func(t *testing.T) {
			t.Parallel()
			cutter := &replyCutter{marker: []byte("in_grace")}
			cutter.cuts.Store(1)
			holder := &replyHolder{marker: []byte("in_grace"), release: make(chan struct{})}
			opt := cutter.option()
			if late {
				opt = holder.option()
			}
			pool := testdb.New(t, testdb.MaxConns(8), opt)
			s := batchedStore(t, pool)
			var calls atomic.Int64
			mw := newMiddleware(t, s, idempotency.Config{StoreTimeout: 6 * time.Second, Lease: 20 * time.Second})
			h := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			free := holdSlot(t, pool, s)
			keys := newKeys(8)
			codes := make(chan int, len(keys))
			for _, k := range keys {
				go func() { codes <- do(h, k, `{"qty":1}`).Code }()
			}
			waitQueued(t, s, len(keys))
			free()
			for range keys {
				if c := <-codes; c != http.StatusServiceUnavailable {
					t.Fatalf("a caller of the batch got %d, want 503", c)
				}
			}
			close(holder.release)
			if late && holder.held.Load() != 1 || !late && cutter.cut.Load() != 1 {
				t.Fatalf("replies held %d, cut %d; want the batch's", holder.held.Load(), cutter.cut.Load())
			}
			for deadline := time.Now().Add(time.Minute); ; {
				var n int
				if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys WHERE idem_key = ANY($1)`, keys).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d rows of the batch's keys were never given back", n)
				}
				time.Sleep(10 * time.Millisecond) // polling the database
			}
			if calls.Load() != 0 {
				t.Fatalf("%d handlers ran for claims whose callers were answered 503", calls.Load())
			}
			for _, k := range keys {
				if c := do(h, k, `{"qty":1}`).Code; c != http.StatusCreated {
					t.Fatalf("the retry of %s: %d, want 201", k, c)
				}
			}
			if calls.Load() != int64(len(keys)) {
				t.Fatalf("executions = %d, want %d", calls.Load(), len(keys))
			}
		})
	}
}
