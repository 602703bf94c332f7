package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestGroupCommitRound: claims and records queued behind a busy slot leave
// together, in one transaction: the new keys are won, the records land,
// a record whose row is no longer its caller's is told so, and one pgx
// batch carried both statements.
func TestGroupCommitRound(t *testing.T) {
	t.Parallel()
	var bc batchCounter
	pool := testdb.New(t, testdb.MaxConns(8), bc.option())
	s := batchedStore(t, pool)
	ctx := t.Context()
	var owned []idempotency.Record // rows to record, claimed while the slot is free
	for range 3 {
		res, err := s.Claim(ctx, slotClaim(uuid.NewString()))
		if err != nil || !res.Won {
			t.Fatalf("claim before the round: %+v %v", res, err)
		}
		owned = append(owned, res.Record)
	}
	stale := owned[2].Fence()
	stale.Attempt++ // not the row's attempt: the record must not land
	release := holdSlot(t, pool, s)
	var once sync.Once
	free := func() { once.Do(release) }
	t.Cleanup(free) // a failure before free below must not leave the pool held
	claimed := make(chan error, 3)
	for range 3 {
		go func() {
			res, err := s.Claim(context.Background(), slotClaim(uuid.NewString()))
			if err == nil && !res.Won {
				err = errors.New("lost a new key")
			}
			claimed <- err
		}()
	}
	recorded := make(chan error, 3)
	resp := idempotency.Response{Status: 201, Body: []byte(`{"ok":true}`), BodyKind: idempotency.BodyJSON}
	for i, rec := range owned {
		f := rec.Fence()
		if i == 2 {
			f = stale
		}
		go func() { recorded <- s.Complete(context.Background(), f, rec, resp) }()
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		if c, r := idempotency.QueuedForTest(s); c == 3 && r == 3 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("%d claims and %d records queued, want 3 and 3", c, r)
		}
	}
	free()
	var notOwner int
	for range 3 {
		if err := <-claimed; err != nil {
			t.Errorf("a queued claim: %v", err)
		}
		switch err := <-recorded; {
		case errors.Is(err, idempotency.ErrNotOwner):
			notOwner++
		case err != nil:
			t.Errorf("a queued record: %v", err)
		}
	}
	if notOwner != 1 {
		t.Errorf("%d records told ErrNotOwner, want 1 (the stale attempt)", notOwner)
	}
	for i, rec := range owned {
		var status string
		if err := pool.QueryRow(ctx, `SELECT status FROM idempotency_keys WHERE id = $1`, rec.ID).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: "completed", false: "in_flight"}[i < 2]; status != want {
			t.Errorf("row %d after its record: %s, want %s", i, status, want)
		}
	}
	if bc.rounds.Load() != 1 {
		t.Errorf("%d transactions carried claims and records, want 1", bc.rounds.Load())
	}
	for name, marker := range map[string]string{"claim": "in_grace", "record": "in_seal"} { // as batchCounter tells them
		if generic, custom := planCounts(t, pool, marker); generic == 0 || custom != 0 {
			t.Errorf("the round's %s statement: %d generic plans, %d custom plans; want generic only", name, generic, custom)
		}
	}
}

// TestGroupCommitRoundCommitFails: a round commits at the end of its pgx
// batch (one implicit transaction, in every QueryExecMode a pool may
// use), and an error of the commit itself fails the round. Here a
// deferred constraint trigger refuses one claim's row only when the round
// commits: no caller is told it won a row that was never committed; the
// round's calls go alone, the others win rows that are there, and the
// refused one gets an error.
func TestGroupCommitRoundCommitFails(t *testing.T) {
	t.Parallel()
	eachExecMode(t, roundCommitFails)
}

// eachExecMode runs f as a parallel subtest for each pgx QueryExecMode,
// on a pool of its own in that mode, traced by bc.
func eachExecMode(t *testing.T, f func(t *testing.T, pool *pgxpool.Pool, bc *batchCounter)) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			var bc batchCounter
			pool := testdb.New(t, testdb.MaxConns(8), bc.option(),
				testdb.Configure(func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode }))
			f(t, pool, &bc)
		})
	}
}

func roundCommitFails(t *testing.T, pool *pgxpool.Pool, bc *batchCounter) {
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
		CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON idempotency_keys DEFERRABLE INITIALLY DEFERRED
		FOR EACH ROW WHEN (NEW.scope_endpoint = 'POST /refused') EXECUTE PROCEDURE refuse_at_commit()`); err != nil {
		t.Fatal(err)
	}
	s := batchedStore(t, pool)
	release := holdSlot(t, pool, s)
	var once sync.Once
	free := func() { once.Do(release) }
	t.Cleanup(free)
	reqs := []idempotency.ClaimRequest{slotClaim(uuid.NewString()), slotClaim(uuid.NewString()), slotClaim(uuid.NewString())}
	reqs[2].Endpoint = "POST /refused"
	type answer struct {
		res idempotency.ClaimResult
		err error
	}
	answers := make([]chan answer, len(reqs))
	for i, req := range reqs {
		answers[i] = make(chan answer, 1)
		go func() {
			res, err := s.Claim(context.Background(), req)
			answers[i] <- answer{res, err}
		}()
	}
	waitQueued(t, s, len(reqs))
	free()
	for i, req := range reqs {
		a := <-answers[i]
		refused := req.Endpoint == "POST /refused"
		if refused && (a.err == nil || a.res.Won) || !refused && (a.err != nil || !a.res.Won) {
			t.Errorf("claim %d (%s): won %v, error %v", i, req.Endpoint, a.res.Won, a.err)
		}
		var rows int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE idem_key = $1 AND scope_endpoint = $2`,
			req.Key, req.Endpoint).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if a.res.Won && rows != 1 {
			t.Errorf("claim %d was told it won, and its row is not there", i)
		}
	}
	if bc.claims.Load() == 0 {
		t.Error("no round carried the claims")
	}
}

// TestGroupCommitRoundLockWait: a round's settings and its claim run in
// one transaction in every QueryExecMode, so a round whose claim meets
// another session's uncommitted row of one of its keys stops waiting at
// the round's lock_timeout (DefaultTxLockWait) and its calls go alone: the
// other key wins while that row is still held, and the held key wins once
// it is released. The setting ends with the round: every connection is
// back at the session's lock_timeout.
func TestGroupCommitRoundLockWait(t *testing.T) {
	t.Parallel()
	eachExecMode(t, func(t *testing.T, pool *pgxpool.Pool, bc *batchCounter) {
		ctx := t.Context()
		var session string
		if err := pool.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&session); err != nil {
			t.Fatal(err)
		}
		s := batchedStore(t, pool)
		free := holdSlot(t, pool, s)
		held := slotClaim(uuid.NewString())
		hold, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer hold.Rollback(context.Background()) //nolint:errcheck // rolled back below; this covers a failure before
		if _, err := hold.Exec(ctx, `INSERT INTO idempotency_keys (idem_key, scope_endpoint, request_hash, locked_until, expires_at)
			VALUES ($1, $2, '', now(), now())`, held.Key, held.Endpoint); err != nil {
			t.Fatal(err)
		}
		claim := func(req idempotency.ClaimRequest, into chan<- error) {
			res, err := s.Claim(context.Background(), req)
			if err == nil && !res.Won {
				err = errors.New("lost")
			}
			into <- err
		}
		heldDone, freshDone := make(chan error, 1), make(chan error, 1)
		go claim(held, heldDone)
		go claim(slotClaim(uuid.NewString()), freshDone)
		waitQueued(t, s, 2)
		free()
		if err := await(t, freshDone, "the new key waited on another key's held row: the round's lock wait was not bounded"); err != nil {
			t.Errorf("the new key: %v", err)
		}
		if bc.claims.Load() != 1 {
			t.Errorf("%d claim batches, want 1", bc.claims.Load())
		}
		if err := hold.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := await(t, heldDone, "the held key's claim never returned"); err != nil {
			t.Errorf("the held key, once released: %v", err)
		}
		for _, c := range pool.AcquireAllIdle(ctx) {
			var got string
			err := c.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&got)
			c.Release()
			if err != nil || got != session {
				t.Errorf("lock_timeout %q after the round (%v), want the session's %q", got, err, session)
			}
		}
	})
}

// await is the error from done, or a fatal hung after a minute (an upper
// bound that proves "never hangs", not a speed).
func await(t *testing.T, done <-chan error, hung string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal(hung)
		return nil
	}
}
