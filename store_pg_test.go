package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
)

func TestPostgresStore(t *testing.T) {
	t.Parallel()
	idempotencytest.Run(t, func(t *testing.T) idempotency.Store {
		return idempotency.NewPostgresStore(testdb.New(t))
	})
}

func TestPostgresBodies(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.New(t)
	s := idempotency.NewPostgresStore(pool)

	type columns struct {
		JSON, Raw, Headers []byte // nil for NULL
	}
	stored := func(t *testing.T, id int64) columns {
		t.Helper()
		var c columns
		err := pool.QueryRow(ctx, `SELECT response_body, response_body_raw, response_headers
			FROM idempotency_keys WHERE id = $1`, id).Scan(&c.JSON, &c.Raw, &c.Headers)
		if err != nil {
			t.Fatalf("read columns: %v", err)
		}
		return c
	}
	complete := func(t *testing.T, resp idempotency.Response) (idempotency.Record, idempotency.Record) {
		t.Helper()
		req := idempotencytest.Request("bodies", time.Hour, time.Minute)
		rec := idempotencytest.MustClaim(t, s, req)
		if err := s.Complete(ctx, rec.Fence(), rec, resp); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		res, err := s.Claim(ctx, req)
		if err != nil || res.Won {
			t.Fatalf("Claim after Complete: won %v err %v", res.Won, err)
		}
		return rec, res.Record
	}

	t.Run("JSONByteForByte", func(t *testing.T) {
		// Keys out of order, odd white space, number forms JSONB would
		// rewrite: the stored and replayed bytes are the handler's.
		body := "{ \"b\" : [1, 2.50, 1e2],\n\t\"a\": {\"z\":null,   \"y\": \"\\u00e9\\n\"}, \"big\": 123456789012345678901234567890 }"
		rec, got := complete(t, idempotency.Response{Status: 201, Body: []byte(body), BodyKind: idempotency.BodyJSON,
			Header: http.Header{"Content-Type": {"application/json"}, "Content-Language": {"en", "de"}}})
		c := stored(t, rec.ID)
		if string(c.JSON) != body || c.Raw != nil {
			t.Fatalf("JSON body stored as %q raw %q, want the exact bytes in response_body only", c.JSON, c.Raw)
		}
		if got.Response.BodyKind != idempotency.BodyJSON || string(got.Response.Body) != body {
			t.Errorf("JSON body read back as kind %d %q, want BodyJSON %q byte for byte", got.Response.BodyKind, got.Response.Body, body)
		}
		if string(c.Headers) != `{"Content-Language":["en","de"],"Content-Type":["application/json"]}` {
			t.Errorf("headers stored as %q, want their JSON object of string arrays", c.Headers)
		}
		if got.Response.Header.Get("Content-Type") != "application/json" || len(got.Response.Header["Content-Language"]) != 2 {
			t.Errorf("headers read back as %v", got.Response.Header)
		}
	})

	t.Run("JSONThatJSONBRefusedIsStoredAsIs", func(t *testing.T) {
		// \u0000 and a lone surrogate, which JSONB refused, and a number
		// beyond numeric's range: bytes like any other.
		for _, body := range []string{`{"name": "a\u0000b"}`, `{"s": "\ud800"}`, `[1e400000]`} {
			rec, got := complete(t, idempotency.Response{Status: 200, Body: []byte(body), BodyKind: idempotency.BodyJSON})
			if c := stored(t, rec.ID); string(c.JSON) != body || c.Raw != nil {
				t.Fatalf("%s stored as %q raw %q, want the exact bytes in response_body", body, c.JSON, c.Raw)
			}
			if got.Response.BodyKind != idempotency.BodyJSON || string(got.Response.Body) != body {
				t.Fatalf("read back as kind %d %q, want BodyJSON %q byte for byte", got.Response.BodyKind, got.Response.Body, body)
			}
		}
	})

	t.Run("EmptyRawIsNotNULL", func(t *testing.T) {
		rec, got := complete(t, idempotency.Response{Status: 200, BodyKind: idempotency.BodyRaw}) // nil Body
		c := stored(t, rec.ID)
		if c.Raw == nil || len(c.Raw) != 0 || c.JSON != nil {
			t.Fatalf("empty raw body stored as raw %#v json %q, want an empty bytea, not NULL", c.Raw, c.JSON)
		}
		if got.Response.BodyKind != idempotency.BodyRaw || len(got.Response.Body) != 0 {
			t.Fatalf("read back as kind %d %q, want an empty BodyRaw", got.Response.BodyKind, got.Response.Body)
		}
	})

	t.Run("NoneStoresNoBody", func(t *testing.T) {
		rec, got := complete(t, idempotency.Response{Status: 201, Body: []byte("ignored"), BodyKind: idempotency.BodyNone})
		c := stored(t, rec.ID)
		if c.JSON != nil || c.Raw != nil || c.Headers != nil {
			t.Fatalf("BodyNone stored json %q raw %q headers %q, want all NULL", c.JSON, c.Raw, c.Headers)
		}
		if got.Response.BodyKind != idempotency.BodyNone || got.Response.Body != nil || got.Response.Status != 201 {
			t.Fatalf("read back as %+v, want status 201 and no body", got.Response)
		}
	})

	t.Run("HeaderValueWithNULIsDropped", func(t *testing.T) {
		_, got := complete(t, idempotency.Response{Status: 200, BodyKind: idempotency.BodyRaw, Body: []byte("x"),
			Header: http.Header{"Content-Type": {"text/plain"}, "X-Bad": {"a\x00b", "ok"}}})
		if got.Response.Header.Get("Content-Type") != "text/plain" || len(got.Response.Header["X-Bad"]) != 1 || got.Response.Header["X-Bad"][0] != "ok" {
			t.Fatalf("headers read back as %v", got.Response.Header)
		}
	})
}

func TestPostgresRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var c pgCounter
	pool := testdb.New(t, testdb.MaxConns(1), testdb.Tracer(&c), testdb.Configure(func(cfg *pgxpool.Config) {
		var d net.Dialer
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{Conn: conn, n: &c.writes}, nil
		}
	}))
	s := idempotency.NewPostgresStore(pool)
	resp := idempotency.Response{Status: 201, Body: []byte(`{"id":1}`), BodyKind: idempotency.BodyJSON,
		Header: http.Header{"Content-Type": {"application/json"}}}

	measure := func(what string, f func() error) {
		t.Helper()
		c.reset()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		st, wr := c.statements.Load(), c.writes.Load()
		t.Logf("%s: %d statement(s), %d round trip(s)", what, st, wr)
		if st != 1 || wr != 1 {
			t.Errorf("%s: %d statements and %d round trips, want 1 and 1", what, st, wr)
		}
	}

	// The first use of each statement on a connection also prepares it
	// (one more round trip); what follows runs on the warm connection.
	warm := idempotencytest.Request("rt", time.Hour, time.Minute)
	c.reset()
	rec := idempotencytest.MustClaim(t, s, warm)
	t.Logf("cold Claim: %d statement(s), %d round trip(s)", c.statements.Load(), c.writes.Load())
	if err := s.Complete(ctx, rec.Fence(), rec, resp); err != nil {
		t.Fatal(err)
	}

	req := idempotencytest.Request("rt", time.Hour, time.Minute)
	var won idempotency.ClaimResult
	measure("Claim of a new key", func() (err error) {
		won, err = s.Claim(ctx, req)
		if err == nil && !won.Won {
			err = errors.New("did not win")
		}
		return err
	})
	measure("Claim by a loser (in flight)", func() error {
		res, err := s.Claim(ctx, req)
		if err == nil && res.Won {
			err = errors.New("won twice")
		}
		return err
	})
	measure("Complete", func() error { return s.Complete(ctx, won.Record.Fence(), won.Record, resp) })
	measure("Claim by a loser (replay)", func() error {
		res, err := s.Claim(ctx, req)
		if err == nil && (res.Won || res.Record.Status != idempotency.StatusCompleted) {
			err = errors.New("not a replay")
		}
		return err
	})
}

func TestPostgresFencing(t *testing.T) {
	t.Parallel()

	t.Run("TakeoverRacingComplete", func(t *testing.T) {
		t.Parallel()
		s := idempotency.NewPostgresStore(testdb.New(t))
		ctx := t.Context()
		for range 20 {
			req := idempotencytest.Request("u", time.Millisecond, time.Millisecond)
			owner := idempotencytest.MustClaim(t, s, req).Fence()
			old := idempotencytest.WaitFor(t, s, req, "in the awaited state", func(r idempotency.Record) bool { return r.Expired && r.LeaseOver })
			next := req
			next.RequestHash = strings.Repeat("cd", 32)
			next.TTL = time.Hour

			var (
				completeErr error
				takeover    idempotency.ClaimResult
				takeoverErr error
				wg          sync.WaitGroup
			)
			start := make(chan struct{})
			wg.Go(func() {
				<-start
				completeErr = s.Complete(ctx, owner, idempotency.Record{}, idempotency.Response{Status: 201, Body: []byte("stale"), BodyKind: idempotency.BodyRaw})
			})
			wg.Go(func() {
				<-start
				takeover, takeoverErr = s.Takeover(ctx, old.Fence(), next)
			})
			close(start)
			wg.Wait()
			if takeoverErr != nil || (completeErr != nil && completeErr != idempotency.ErrNotOwner) {
				t.Fatalf("Takeover: %v; Complete: %v", takeoverErr, completeErr)
			}
			// Completing does not bump the attempt, so a takeover of the
			// expired row wins whichever ran first; what must never happen
			// is the stale owner's response landing on the new claim.
			if !takeover.Won {
				t.Fatalf("Takeover of an expired row lost (Complete: %v)", completeErr)
			}
			got, err := s.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			r := got.Record
			if r.Attempt != owner.Attempt+1 || r.Status != idempotency.StatusInFlight || r.RequestHash != next.RequestHash ||
				r.Response.Status != 0 || r.Response.Body != nil {
				t.Fatalf("after the race (Complete: %v): row %+v, want the takeover's fresh in-flight claim", completeErr, r)
			}
			if err := s.Complete(ctx, owner, idempotency.Record{}, idempotency.Response{Status: 200, BodyKind: idempotency.BodyNone}); err != idempotency.ErrNotOwner {
				t.Fatalf("stale owner's Complete after the takeover: %v, want ErrNotOwner", err)
			}
		}
	})

	t.Run("TwoPoolsOneWinner", func(t *testing.T) {
		t.Parallel()
		poolA := testdb.New(t)
		cfg := poolA.Config()
		poolB, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(poolB.Close)
		stores := []idempotency.Store{idempotency.NewPostgresStore(poolA), idempotency.NewPostgresStore(poolB)}

		for range 5 {
			req := idempotencytest.Request("u", time.Hour, time.Minute)
			const racers = 64
			results := make([]idempotency.ClaimResult, racers)
			errs := make([]error, racers)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range racers {
				wg.Go(func() {
					<-start
					results[i], errs[i] = stores[i%2].Claim(t.Context(), req)
				})
			}
			close(start)
			wg.Wait()
			winners := 0
			var id int64
			for i, res := range results {
				if errs[i] != nil {
					t.Fatalf("racer %d: %v", i, errs[i])
				}
				if res.Won {
					winners++
				}
				if id == 0 {
					id = res.Record.ID
				} else if res.Record.ID != id {
					t.Fatalf("racers saw rows %d and %d", id, res.Record.ID)
				}
			}
			if winners != 1 {
				t.Fatalf("%d winners among %d racers on two pools, want 1", winners, racers)
			}
		}
	})

	t.Run("CleanupRacingClaims", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		s := idempotency.NewPostgresStore(pool)
		ctx := t.Context()
		const n = 40
		// live: expired but their owner's lease runs: cleanup must keep them.
		// orphans: expired, lease over: cleanup may delete them, unless a
		// claim takes them over first.
		var live, orphans []idempotency.ClaimRequest
		var liveFences []idempotency.Fence
		for range n {
			req := idempotencytest.Request("u", time.Millisecond, time.Hour)
			liveFences = append(liveFences, idempotencytest.MustClaim(t, s, req).Fence())
			live = append(live, req)
			orphan := idempotencytest.Request("u", time.Millisecond, time.Millisecond)
			idempotencytest.MustClaim(t, s, orphan)
			orphans = append(orphans, orphan)
		}
		idempotencytest.WaitFor(t, s, orphans[n-1], "in the awaited state", func(r idempotency.Record) bool { return r.Expired && r.LeaseOver })
		idempotencytest.WaitFor(t, s, live[n-1], "in the awaited state", func(r idempotency.Record) bool { return r.Expired })

		stop := make(chan struct{})
		var deleted atomic.Int64
		var cleaners, claimers sync.WaitGroup
		errc := make(chan error, 16)
		for range 2 {
			cleaners.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					k, err := s.Cleanup(ctx, 7)
					if err != nil {
						errc <- err
						return
					}
					deleted.Add(k)
				}
			})
		}
		// Claimers take orphans over (or claim them anew once deleted) and
		// claim new keys, racing the cleaners.
		// Each orphan ends up owned, once: taken over (its row, attempt 2)
		// or, when cleanup deleted it first, claimed anew (a new row).
		owned := make(chan idempotency.Fence, 4*n)
		var anew atomic.Int64
		for w := range 4 {
			claimers.Go(func() {
				for i := w; i < n; i += 4 {
					req := orphans[i]
					req.TTL, req.Lease = time.Hour, time.Hour
					var res idempotency.ClaimResult
					for round := 0; !res.Won; round++ {
						if round == 4 {
							errc <- errors.New("an orphan's row kept changing")
							return
						}
						var err error
						res, err = s.Claim(ctx, req)
						if err != nil {
							errc <- err
							return
						}
						if res.Won {
							anew.Add(1)
							break
						}
						if !res.Record.Expired {
							errc <- fmt.Errorf("an orphan's row is live: %+v", res.Record)
							return
						}
						// A takeover that loses to cleanup claims again.
						if res, err = s.Takeover(ctx, res.Record.Fence(), req); err != nil {
							errc <- err
							return
						}
					}
					owned <- res.Record.Fence()
					fresh := idempotencytest.Request("u", time.Hour, time.Hour)
					res, err := s.Claim(ctx, fresh)
					if err != nil || !res.Won {
						errc <- errors.Join(err, errors.New("claim of a fresh key lost"))
						return
					}
					owned <- res.Record.Fence()
				}
			})
		}
		claimers.Wait()
		close(stop)
		cleaners.Wait()
		close(owned)
		close(errc)
		for err := range errc {
			t.Fatal(err)
		}
		// Every live in-flight row survived: its owner can still complete it.
		resp := idempotency.Response{Status: 200, BodyKind: idempotency.BodyNone}
		for _, f := range liveFences {
			if err := s.Complete(ctx, f, idempotency.Record{}, resp); err != nil {
				t.Fatalf("owner of an expired row with a live lease: Complete: %v (cleanup deleted it?)", err)
			}
		}
		count := 0
		for f := range owned {
			count++
			if err := s.Complete(ctx, f, idempotency.Record{}, resp); err != nil {
				t.Fatalf("claimer racing cleanup: Complete: %v (cleanup deleted a live row?)", err)
			}
		}
		if count != 2*n {
			t.Fatalf("%d claims won, want %d (every orphan, every fresh key)", count, 2*n)
		}
		// Cleanup deleted exactly the orphans that were then claimed anew:
		// no live row, and no orphan twice.
		if deleted.Load() != anew.Load() {
			t.Fatalf("cleanup deleted %d rows, but %d orphans were claimed anew after their deletion", deleted.Load(), anew.Load())
		}
		var rows, orphanRows int
		if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE idem_key = ANY($1)) FROM idempotency_keys`,
			orphanKeys(orphans)).Scan(&rows, &orphanRows); err != nil {
			t.Fatal(err)
		}
		if rows != 3*n || orphanRows != n {
			t.Fatalf("%d rows (%d of orphan keys) left, want %d (%d)", rows, orphanRows, 3*n, n)
		}
		t.Logf("cleanup deleted %d rows while %d claims were won", deleted.Load(), count)
	})
}

// TestPostgresEraseRacingTakeover: a user's expired completed row is being
// taken over (a retry after expiry) while Erase runs and waits for its row
// lock. Every row of the scope must come out deleted or reported as
// skipped, never neither. Found by a review: the DELETE's re-check skipped
// the taken-over row while the report, read from the statement's snapshot,
// still saw it as deletable; erase now runs in REPEATABLE READ and retries.
//
// The store's own Takeover and Erase race: a third transaction holds
// the row's lock until both are queued on it, the takeover first, so the
// takeover commits while the erase waits.
func TestPostgresEraseRacingTakeover(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.New(t)
	s := idempotency.NewPostgresStore(pool)

	req := idempotencytest.Request("gdpr-user", time.Millisecond, time.Millisecond)
	rec := idempotencytest.MustClaim(t, s, req)
	if err := s.Complete(ctx, rec.Fence(), rec, idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}); err != nil {
		t.Fatal(err)
	}
	rec = idempotencytest.WaitFor(t, s, req, "in the awaited state", func(r idempotency.Record) bool { return r.Expired })

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	var blocker uint32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&blocker); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE id = $1 FOR UPDATE`, rec.ID); err != nil {
		t.Fatal(err)
	}

	// A retry's takeover, with a lease that outlives the test: once it
	// commits, the row is in flight and erasure must skip and report it.
	retry := idempotencytest.Request("gdpr-user", time.Hour, time.Hour)
	retry.Key = req.Key
	taken := make(chan error, 1)
	go func() {
		tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := s.Takeover(tctx, rec.Fence(), retry)
		if err == nil && !res.Won {
			err = errors.New("the takeover lost")
		}
		taken <- err
	}()
	waitBlockedTree(t, pool, blocker, 1)

	type out struct {
		res idempotency.ErasureResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		ectx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := s.Erase(ectx, "gdpr-user")
		done <- out{res, err}
	}()
	waitBlockedTree(t, pool, blocker, 2)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-taken; err != nil {
		t.Fatalf("Takeover: %v", err)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("Erase: %v", o.err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE scope_user_id = 'gdpr-user'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != len(o.res.Skipped) {
		t.Fatalf("erase reported Deleted=%d Skipped=%d, but %d row(s) of the user remain: a row was neither erased nor reported",
			o.res.Deleted, len(o.res.Skipped), left)
	}
	if left != 1 || o.res.Deleted != 0 || o.res.Skipped[0].ID != rec.ID || o.res.Skipped[0].Attempt != rec.Attempt+1 {
		t.Fatalf("erase reported Deleted=%d Skipped=%+v with %d row(s) left; want the taken-over row skipped",
			o.res.Deleted, o.res.Skipped, left)
	}
}

// TestPostgresUnrepresentableJSONNumber: a JSON response with numbers
// beyond numeric's range (which the ADR's JSONB column refused) is recorded
// as it is, like any body, so the retry replays it rather than finding the
// key in flight.
func TestPostgresUnrepresentableJSONNumber(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, hugeNumbersJSON)
	}))
	key := uuid.NewString()
	if w := do(h, key, `{}`); w.Code != 201 || w.Body.String() != hugeNumbersJSON {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	w := do(h, key, `{}`)
	want := `{"idempotency_replayed":true,` + strings.TrimPrefix(hugeNumbersJSON, "{")
	if w.Header().Get(idempotency.HeaderReplayed) != "true" || w.Body.String() != want {
		t.Fatalf("retry: %d %s", w.Code, w.Body)
	}
	if calls.Load() != 1 {
		t.Fatalf("executions %d", calls.Load())
	}
}

// TestPostgresReplayJSONByteForByte: a JSON body with its keys out of order
// and odd white space replays as the handler wrote it: byte for byte on a
// route with NoReplayMarker, and on a default route the same bytes with
// "idempotency_replayed":true inserted after the opening brace.
func TestPostgresReplayJSONByteForByte(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	const body = "{ \"z\" :1,\n  \"a\":[ 2.50 , 1e2 ],\t\"m\": {\"y\":\"\\u00e9\", \"b\":null} }\n"
	for _, marker := range []bool{false, true} {
		var calls atomic.Int64
		name := fmt.Sprintf("bytes-marker-%v", marker)
		h := mw.MustRoute(idempotency.RouteConfig{Name: name, NoReplayMarker: !marker})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, body)
		}))
		key := uuid.NewString()
		if w := do(h, key, `{}`); w.Code != 201 || w.Body.String() != body {
			t.Fatalf("%s: first: %d %q", name, w.Code, w.Body)
		}
		want := body
		if marker {
			want = "{\"idempotency_replayed\":true, \"z\" :1,\n  \"a\":[ 2.50 , 1e2 ],\t\"m\": {\"y\":\"\\u00e9\", \"b\":null} }\n"
		}
		w := do(h, key, `{}`)
		if w.Code != 201 || w.Header().Get(idempotency.HeaderReplayed) != "true" || w.Body.String() != want {
			t.Fatalf("%s: replay: %d %q, want 201 %q", name, w.Code, w.Body, want)
		}
		if calls.Load() != 1 {
			t.Fatalf("%s: executions %d", name, calls.Load())
		}
	}
}
