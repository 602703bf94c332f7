package idempotencytest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// txKit is one RunTx run: the caller's store, write and count.
type txKit struct {
	newStore func(*testing.T) idempotency.TxStore
	write    func(ctx context.Context, tx any) error
	count    func(t *testing.T) int
}

// txCheck is one of RunTx's subtests, given a fresh store.
type txCheck struct {
	name string
	run  func(t *testing.T, k *txKit, s idempotency.TxStore)
}

// RunTx runs the transactional part of the suite against the TxStores
// newStore returns: the claim inside the transaction, the savepoint that
// keeps the claim when the writes are undone, the record that commits with
// the writes, the rollback that frees the key, a duplicate waiting on an
// owner whose transaction is open, and a session the server closed (what a
// process that dies mid-handler leaves: nothing). write writes one row
// through tx, which is what RouteTx.Tx returns (a pgx.Tx for
// PostgresStore), as a handler would; count returns how many of those rows
// are committed in the store newStore returned for the same t. Every
// subtest runs in parallel and calls newStore once, so each store must be
// empty and share nothing with the others (for a database, its own schema).
func RunTx(t *testing.T, newStore func(*testing.T) idempotency.TxStore, write func(ctx context.Context, tx any) error, count func(t *testing.T) int) {
	k := &txKit{newStore: newStore, write: write, count: count}
	t.Run("Tx", func(t *testing.T) {
		t.Parallel()
		for _, c := range append(append(txClaimChecks, txDuplicateChecks...), txCrashCheck) {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				c.run(t, k, k.newStore(t))
			})
		}
	})
}

// txRequest is a claim of a new key for a transactional check.
func txRequest() idempotency.ClaimRequest {
	req := newRequest("user-1")
	req.LockWait = 50 * time.Millisecond
	return req
}

// mustBegin claims req's new key inside a transaction (nil req: a
// transaction alone) and returns it open.
func mustBegin(t *testing.T, s idempotency.TxStore, req *idempotency.ClaimRequest) (idempotency.RouteTx, idempotency.Record) {
	t.Helper()
	tx, res, err := s.BeginClaim(t.Context(), req)
	switch {
	case err != nil:
		t.Fatalf("BeginClaim: %v", err)
	case tx == nil:
		t.Fatal("BeginClaim: no transaction (contention) for a key nobody holds")
	case req != nil && !res.Won:
		_ = tx.Abort(t.Context())
		t.Fatalf("BeginClaim of a new key: Won = false, record %+v", res.Record)
	}
	t.Cleanup(func() { _ = tx.Abort(context.Background()) }) // changes nothing once ended
	if st := tx.State(); st != idempotency.TxOpen {
		t.Fatalf("State after BeginClaim = %v, want TxOpen", st)
	}
	return tx, res.Record
}

// mustWrite writes one row through tx.
func (k *txKit) mustWrite(t *testing.T, tx idempotency.RouteTx) {
	t.Helper()
	if err := k.write(t.Context(), tx.Tx()); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// wantCount checks the committed rows of write.
func (k *txKit) wantCount(t *testing.T, want int, why string) {
	t.Helper()
	if n := k.count(t); n != want {
		t.Fatalf("%d rows written through the transaction are committed, want %d: %s", n, want, why)
	}
}

// claimsAgain reports whether a new transaction wins req's key at once
// (the key is free), rolling it back.
func claimsAgain(t *testing.T, s idempotency.TxStore, req idempotency.ClaimRequest) bool {
	t.Helper()
	tx, res, err := s.BeginClaim(t.Context(), &req)
	if err != nil {
		t.Fatalf("BeginClaim again: %v", err)
	}
	if tx != nil {
		_ = tx.Abort(t.Context())
	}
	return tx != nil && res.Won
}

var txClaimChecks = []txCheck{
	{"RecordCommitsWithTheWrites", func(t *testing.T, k *txKit, s idempotency.TxStore) {
		req := txRequest()
		tx, rec := mustBegin(t, s, &req)
		checkFresh(t, rec, req, 1)
		k.mustWrite(t, tx)
		k.wantCount(t, 0, "nothing commits before the record")
		resp := jsonResponse()
		if err := tx.Commit(t.Context(), &idempotency.Settlement{Fence: rec.Fence(), Response: resp}); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		k.wantCount(t, 1, "the write commits with the completed record")
		got := Read(t, s, req)
		if got.Status != idempotency.StatusCompleted {
			t.Fatalf("after Commit: %s, want completed", got.Status)
		}
		if d := diffResponse(got.Response, resp); d != "" {
			t.Fatalf("recorded response: %s", d)
		}
	}},
	{"SavepointKeepsTheClaim", func(t *testing.T, k *txKit, s idempotency.TxStore) {
		req := txRequest()
		tx, rec := mustBegin(t, s, &req)
		k.mustWrite(t, tx)
		if err := tx.Commit(t.Context(), &idempotency.Settlement{Fence: rec.Fence(), Failed: true, Undo: true}); err != nil {
			t.Fatalf("Commit failed with Undo: %v", err)
		}
		k.wantCount(t, 0, "Undo rolls the writes back to the savepoint")
		if got := Read(t, s, req); got.Status != idempotency.StatusFailed {
			t.Fatalf("after a failed record: %s, want failed (the claim outlives the undone writes)", got.Status)
		}
	}},
	{"UndoThenComplete", func(t *testing.T, k *txKit, s idempotency.TxStore) {
		// A handler that answered < 500 from an aborted transaction: its
		// writes did not happen, its answer is recorded.
		req := txRequest()
		tx, rec := mustBegin(t, s, &req)
		k.mustWrite(t, tx)
		if err := tx.Commit(t.Context(), &idempotency.Settlement{Fence: rec.Fence(), Undo: true, Response: rawResponse([]byte("declined"))}); err != nil {
			t.Fatalf("Commit with Undo: %v", err)
		}
		k.wantCount(t, 0, "Undo rolls the writes back")
		if got := Read(t, s, req); got.Status != idempotency.StatusCompleted || string(got.Response.Body) != "declined" {
			t.Fatalf("after Undo: %+v, want completed with the answer", got)
		}
	}},
	{"AbortFreesTheKey", func(t *testing.T, k *txKit, s idempotency.TxStore) {
		req := txRequest()
		tx, _ := mustBegin(t, s, &req)
		k.mustWrite(t, tx)
		if err := tx.Abort(t.Context()); err != nil {
			t.Fatalf("Abort: %v", err)
		}
		if err := tx.Abort(t.Context()); err != nil {
			t.Fatalf("Abort again: %v, want nothing changed", err)
		}
		k.wantCount(t, 0, "Abort rolls the writes back")
		if !claimsAgain(t, s, req) {
			t.Fatal("after Abort the key is not free: the claim must roll back with the writes")
		}
	}},
	{"RecordIsFenced", func(t *testing.T, k *txKit, s idempotency.TxStore) {
		req := txRequest()
		tx, rec := mustBegin(t, s, &req)
		k.mustWrite(t, tx)
		stale := rec.Fence()
		stale.Attempt++
		if err := tx.Commit(t.Context(), &idempotency.Settlement{Fence: stale, Response: jsonResponse()}); !errors.Is(err, idempotency.ErrNotOwner) {
			t.Fatalf("Commit with a fence that owns nothing: %v, want ErrNotOwner", err)
		}
		_ = tx.Abort(t.Context())
		k.wantCount(t, 0, "a record fenced out commits nothing")
	}},
	{"UnclaimedTransaction", func(t *testing.T, k *txKit, s idempotency.TxStore) {
		tx, _ := mustBegin(t, s, nil)
		k.mustWrite(t, tx)
		if err := tx.Commit(t.Context(), nil); err != nil {
			t.Fatalf("Commit(nil): %v", err)
		}
		k.wantCount(t, 1, "a transaction without a claim commits its writes")
		tx, _ = mustBegin(t, s, nil)
		k.mustWrite(t, tx)
		if err := tx.Abort(t.Context()); err != nil {
			t.Fatalf("Abort: %v", err)
		}
		k.wantCount(t, 1, "Abort rolls an unclaimed transaction's writes back")
	}},
	{"ExpiredRowIsTakenOver", func(t *testing.T, k *txKit, s idempotency.TxStore) {
		req := txRequest()
		req.TTL, req.Lease = tiny, tiny
		MustClaim(t, s, req)
		old := WaitFor(t, s, req, "expired", isExpired)
		next := req
		next.TTL, next.Lease, next.RequestHash = longTTL, longLease, HashOf("the next request")
		tx, res, err := s.BeginClaim(t.Context(), &next)
		if err != nil || tx == nil || res.Won || res.Record.ID != old.ID {
			t.Fatalf("BeginClaim of an expired row: %v, tx %v, %+v; want the row, not won, in an open transaction", err, tx != nil, res)
		}
		t.Cleanup(func() { _ = tx.Abort(context.Background()) })
		won, err := tx.Takeover(t.Context(), res.Record.Fence(), next)
		if err != nil || !won.Won || won.Record.Attempt != old.Attempt+1 {
			t.Fatalf("Takeover: %v, %+v; want won at attempt %d", err, won, old.Attempt+1)
		}
		k.mustWrite(t, tx)
		if err := tx.Commit(t.Context(), &idempotency.Settlement{Fence: won.Record.Fence(), Failed: true, Undo: true}); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		k.wantCount(t, 0, "Undo after a takeover rolls the writes back")
		if got := Read(t, s, next); got.Status != idempotency.StatusFailed || got.RequestHash != next.RequestHash {
			t.Fatalf("after the takeover's failed record: %+v; want failed under the new hash (Undo never undoes the takeover)", got)
		}
	}},
}

var txDuplicateChecks = []txCheck{
	{"DuplicateOfAnOpenOwnerIsContention", func(t *testing.T, k *txKit, s idempotency.TxStore) {
		req := txRequest()
		owner, rec := mustBegin(t, s, &req)
		k.mustWrite(t, owner)
		dup, res, err := s.BeginClaim(t.Context(), &req)
		if err != nil || dup != nil {
			if dup != nil {
				_ = dup.Abort(t.Context())
			}
			t.Fatalf("duplicate of an open owner: %v, tx %v, %+v; want contention (nil RouteTx, no error)", err, dup != nil, res)
		}
		if err := owner.Commit(t.Context(), &idempotency.Settlement{Fence: rec.Fence(), Response: jsonResponse()}); err != nil {
			t.Fatalf("owner's Commit after the duplicate waited: %v", err)
		}
		dup, res, err = s.BeginClaim(t.Context(), &req)
		if err != nil || dup == nil || res.Won || res.Record.Status != idempotency.StatusCompleted {
			t.Fatalf("duplicate after the owner committed: %v, %+v; want the completed row", err, res)
		}
		_ = dup.Abort(t.Context())
		k.wantCount(t, 1, "one owner, one write")
	}},
	{"DuplicateWinsWhenTheOwnerRollsBack", func(t *testing.T, k *txKit, s idempotency.TxStore) {
		req := txRequest()
		owner, _ := mustBegin(t, s, &req)
		k.mustWrite(t, owner)
		if claimsAgain(t, s, req) {
			t.Fatal("a duplicate won the key of an open owner")
		}
		_ = owner.Abort(t.Context())
		if !claimsAgain(t, s, req) {
			t.Fatal("the owner rolled back, and the duplicate did not win the key")
		}
		k.wantCount(t, 0, "the rolled-back owner's write")
	}},
	{"WaitingDuplicateSeesTheCommit", func(t *testing.T, k *txKit, s idempotency.TxStore) {
		// The duplicate is sent before the owner commits and may wait for
		// it (its bound is long): whichever comes first, it answers as a
		// loser, with the committed row, and never wins.
		req := txRequest()
		owner, rec := mustBegin(t, s, &req)
		k.mustWrite(t, owner)
		waiting := req
		waiting.LockWait = waitBound
		type claimed struct {
			tx  idempotency.RouteTx
			res idempotency.ClaimResult
			err error
		}
		done := make(chan claimed, 1)
		var sent sync.WaitGroup
		sent.Add(1)
		go func() {
			sent.Done()
			tx, res, err := s.BeginClaim(context.Background(), &waiting)
			done <- claimed{tx, res, err}
		}()
		sent.Wait()
		if err := owner.Commit(t.Context(), &idempotency.Settlement{Fence: rec.Fence(), Response: jsonResponse()}); err != nil {
			t.Fatalf("owner's Commit: %v", err)
		}
		var got claimed
		select {
		case got = <-done:
		case <-time.After(2 * waitBound):
			t.Fatal("the waiting duplicate never returned")
		}
		if got.tx != nil {
			_ = got.tx.Abort(t.Context())
		}
		if got.err != nil || got.res.Won || got.res.Record.Status != idempotency.StatusCompleted {
			t.Fatalf("waiting duplicate: %v, %+v; want the committed row", got.err, got.res)
		}
		k.wantCount(t, 1, "one owner, one write")
	}},
}

// txCrashCheck: a session that ends mid-transaction (the server closed it:
// here its idle-in-transaction bound, the claim's lease, ran out, as for an
// owner whose host vanished; a process killed mid-handler closes its
// connection the same way) leaves nothing behind: its writes and its
// claim roll back, and the key is free at once, with no stale row.
var txCrashCheck = txCheck{"ClosedSessionLeavesNothing", func(t *testing.T, k *txKit, s idempotency.TxStore) {
	req := txRequest()
	req.Lease = 500 * time.Millisecond
	owner, _ := mustBegin(t, s, &req)
	k.mustWrite(t, owner)
	next := req
	next.Lease = longLease
	deadline := time.Now().Add(waitBound)
	for !claimsAgain(t, s, next) {
		if time.Now().After(deadline) {
			t.Fatalf("the key is still held %v after its owner's session should have ended (lease %v)", waitBound, req.Lease)
		}
		time.Sleep(20 * time.Millisecond) // the server ends the session on its own clock
	}
	k.wantCount(t, 0, "a closed session commits nothing")
	if err := k.write(t.Context(), owner.Tx()); err == nil {
		t.Fatal("a write through a transaction whose session the server closed succeeded")
	}
	if st := owner.State(); st != idempotency.TxClosed {
		t.Fatalf("State of a transaction whose connection closed = %v, want TxClosed", st)
	}
}}
