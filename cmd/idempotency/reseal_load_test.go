package main

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
)

// TestResealUnderLoad rotates from k1 to k2 while two replicas serve the
// same table, one still sealing with k1 and one with k2: replays of every
// key, new keys completing, and expired keys taken over and completed
// again, all while reseal runs. Every replay, during and after, equals
// the key's first answer (its latest execution's); no row is lost or
// overwritten (once k1 is retired, every key still replays its answer);
// after the load, one more run picks up what the old replica sealed
// meanwhile, and a second run reseals nothing.
func TestResealUnderLoad(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	shared := testDB{dsn: db.dsn, pool: pool, store: idempotency.NewPostgresStore(pool)}
	runs := &keyRuns{n: map[string]int{}}
	oldApp := newSealApp(t, shared, runs, "k1", "k2") // a replica not yet on the new key
	newApp := newSealApp(t, shared, runs, "k2", "k1")
	apps := []*sealApp{oldApp, newApp}

	var mu sync.Mutex
	first := map[string]answer{} // each key's latest execution
	setFirst := func(k string, a answer) {
		mu.Lock()
		defer mu.Unlock()
		first[k] = a
	}
	firstOf := func(k string) answer {
		mu.Lock()
		defer mu.Unlock()
		return first[k]
	}
	execute := func(app *sealApp, k string) {
		t.Helper()
		a := app.send(k)
		if a.status != 201 || a.replayed {
			t.Errorf("key %s: %+v, want a new execution", k, a)
		}
		setFirst(k, a)
	}
	checkReplay := func(app *sealApp, k string) {
		t.Helper()
		if got, want := app.send(k), firstOf(k); !got.replayed || got != (answer{want.status, want.location, want.body, true}) {
			t.Errorf("key %s: %+v, want the replay of %+v", k, got, want)
		}
	}
	var stable, taken []string
	for i := range 150 {
		k := uuid.NewString()
		execute(apps[i%2], k)
		stable = append(stable, k)
	}
	for range 10 {
		k := uuid.NewString()
		execute(oldApp, k)
		taken = append(taken, k)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 3 { // replayers
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				checkReplay(apps[rng.IntN(2)], stable[rng.IntN(len(stable))])
			}
		})
	}
	var writes atomic.Int64
	var written sync.Map
	for i := range 2 { // writers, one per replica
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := uuid.NewString()
				execute(apps[i], k)
				written.Store(k, true)
				checkReplay(apps[1-i], k)
				writes.Add(1)
			}
		})
	}
	rounds := make(chan int, 100)
	wg.Go(func() { // takeovers of expired keys, completed by the old replica
		for round := 1; ; round++ {
			for _, k := range taken {
				if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second', retain_until = now() - interval '1 second' WHERE idem_key = $1`, k); err != nil {
					t.Error(err)
					return
				}
				execute(oldApp, k)
				checkReplay(newApp, k)
			}
			rounds <- round
			select {
			case <-stop:
				return
			default:
			}
		}
	})

	env := sealEnv(db.dsn, "k2", "k1")
	var changed int64
	for range 3 {
		r := runCLI(t, env, "reseal", "--batch", "7", "--json")
		wantCode(t, r, exitOK)
		n := resealJSON(t, r)
		changed += n.Changed
		if n.Unopenable != 0 {
			t.Fatalf("reseal under load: %+v", n)
		}
	}
	for got := 0; got < 2; { // at least two rounds of takeovers overlap the reseals
		select {
		case got = <-rounds:
		case <-time.After(2 * time.Minute):
			t.Fatal("the takeovers stopped")
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("during the reseals: %d keys written, %d rows changed under reseal and left alone", writes.Load(), changed)

	// What the old replica sealed with k1 meanwhile, then nothing.
	wantCode(t, runCLI(t, env, "reseal", "--json"), exitOK)
	last := runCLI(t, env, "reseal", "--json")
	wantCode(t, last, exitOK)
	if n := resealJSON(t, last); n.Read != 0 || n.Resealed != 0 {
		t.Fatalf("second run after the load: %+v, want nothing to reseal", n)
	}

	retired := newSealApp(t, shared, runs, "k2") // k1 retired
	all := append(append([]string(nil), stable...), taken...)
	written.Range(func(k, _ any) bool { all = append(all, k.(string)); return true })
	for _, k := range all {
		checkReplay(retired, k)
	}
	for _, k := range stable {
		if n := runs.of(k); n != 1 {
			t.Fatalf("stable key %s executed %d times", k, n)
		}
	}
	var rows, sealedK2 int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'completed' AND seal_key_id = 'k2') FROM idempotency_keys`).Scan(&rows, &sealedK2); err != nil {
		t.Fatal(err)
	}
	if rows != len(all) || sealedK2 != rows {
		t.Fatalf("%d rows, %d completed and sealed with k2; want %d keys, all", rows, sealedK2, len(all))
	}
}

// TestResealFencedAgainstTakeover: reseal reads a completed row, and
// before its write lands, a takeover of the expired key commits a new
// execution there (a transactional route of a replica still sealing with
// k1: its transaction holds the row until it commits, so the write waits
// for it). The write is fenced on the row as read: it changes nothing, is
// counted as changed, and the new execution's answer stays; the next run
// reseals it.
func TestResealFencedAgainstTakeover(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	shared := testDB{dsn: db.dsn, pool: pool, store: idempotency.NewPostgresStore(pool)}
	runs := &keyRuns{n: map[string]int{}}
	app := newSealApp(t, shared, runs, "k1")
	entered, gate := make(chan struct{}), make(chan struct{})
	txApp := newSealTxApp(t, shared, runs, func() { close(entered); <-gate }, "k1")

	key := uuid.NewString()
	if a := app.send(key); a.status != 201 || a.replayed {
		t.Fatalf("first execution: %+v", a)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second', retain_until = now() - interval '1 second' WHERE idem_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	second := make(chan answer, 1)
	go func() { second <- txApp.send(key) }()
	select {
	case <-entered: // the takeover holds the row inside its transaction
	case <-time.After(time.Minute):
		t.Fatal("the takeover's handler never ran")
	}
	resealed := make(chan result, 1)
	go func() { resealed <- runCLI(t, sealEnv(db.dsn, "k2", "k1"), "reseal", "--json") }()
	// Only reseal's UPDATE (resealUpdateSQL) waiting counts: under load,
	// the CLI's Check probe can wait on the table's extension lock too, and
	// opening the gate then lets the takeover commit before reseal reads.
	for deadline := time.Now().Add(time.Minute); ; {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'idempotency-cli' AND wait_event_type = 'Lock'
				AND position('response_body_raw = $5' in query) > 0`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("reseal's write never waited for the takeover's row")
		}
		time.Sleep(5 * time.Millisecond) // polling the server's view
	}
	close(gate)
	taken := <-second
	if taken.status != 201 || taken.replayed {
		t.Fatalf("the takeover: %+v, want a new execution", taken)
	}
	r := <-resealed
	wantCode(t, r, exitOK)
	if n := resealJSON(t, r); n.Read != 1 || n.Changed != 1 || n.Resealed != 0 {
		t.Fatalf("reseal racing the takeover: %+v, want the row read, changed, not written", n)
	}
	var attempt int
	var keyID string
	if err := pool.QueryRow(ctx, `SELECT attempt, seal_key_id FROM idempotency_keys WHERE idem_key = $1`, key).Scan(&attempt, &keyID); err != nil {
		t.Fatal(err)
	}
	if attempt != 2 || keyID != "k1" {
		t.Fatalf("the row after the race: attempt %d, key id %s; want the takeover's, 2 and k1", attempt, keyID)
	}
	if n := resealJSON(t, runCLI(t, sealEnv(db.dsn, "k2", "k1"), "reseal", "--json")); n.Resealed != 1 {
		t.Fatalf("the next run: %+v, want the row resealed", n)
	}
	if got := newSealApp(t, shared, runs, "k2").send(key); got != (answer{taken.status, taken.location, taken.body, true}) {
		t.Fatalf("after both runs: %+v, want the replay of the takeover's %+v", got, taken)
	}
}
