//go:build matrix

package matrix

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idempotency/downstream"
)

// The derived key across a kill -9 (issue #35): the child's handler
// derives the id it would send a downstream (downstream.Key), prints it,
// and dies; the key's retry in a fresh process runs the handler again (a
// transactional claim vanished with its transaction; an ordinary claim is
// made expired, as time would, and taken over, attempt 2) and must derive
// the same id, so a downstream that deduplicates by it books once.

// naDeriveOpen: the row's path is the same on both policies, and the
// bypass (the one fail-open path) derives from the call's claim, which
// the engine tests cover (downstream/key_test.go).
const naDeriveOpen = "no outage here: fail-open runs the fail-closed path; the bypass's derivation is tested in package downstream"

func deriveCrashFault() *fault {
	return &fault{name: "derived key across kill -9", na: both(needsDB(naMemoryCr), func(c column) string {
		if c.v.open {
			return naDeriveOpen
		}
		return ""
	}), run: runDeriveCrash}
}

// deriveKeys is the keyring the parent and its children share.
func deriveKeys(t testing.TB) *downstream.Keyring {
	k := sha256.Sum256([]byte("matrix derive key"))
	ring, err := downstream.ParseKeys("m1:" + base64.StdEncoding.EncodeToString(k[:]))
	if err != nil {
		t.Fatal(err)
	}
	return ring
}

// derivedID is the id a handler derives for the venue's entry leg, or
// the error's text.
func derivedID(ctx context.Context) string {
	id, err := downstream.Key(ctx, "venue", "entry", downstream.Alpaca)
	if err != nil {
		return "error:" + err.Error()
	}
	return id
}

func runDeriveCrash(t *testing.T, c cell) {
	e := newEnv(t, c, envOpts{})
	derive := envChildDerive + "=1"
	doomed := startChildEnv(t, e, true, derive)
	key := newKey()
	go func() {
		for range 4 { // as runCrash: a refused claim is sent again after Retry-After
			a := doomed.call(e, key)
			if doomed.ranCount(key) > 0 || a.code != "idempotency_store_unavailable" && a.code != "idempotency_in_flight" {
				return
			}
			time.Sleep(time.Second) // Retry-After, not a synchronisation
		}
	}()
	if !doomed.waitRan(key, 30*time.Second) {
		e.failf("the child's handler never ran")
		return
	}
	first := doomed.derivedOf(key)
	if err := doomed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = doomed.cmd.Wait()
	if !c.v.tx {
		e.expireRow(key) // the crashed owner's claim committed: past its lease and expiry, the retry takes it over
	}
	fresh := startChildEnv(t, e, false, derive)
	again := fresh.call(e, key)
	// Retry-After: a dead transaction ends once the database sees its
	// socket closed; a loaded store may answer 503 as a client retries.
	for i := 0; i < 4 && (again.code == "idempotency_in_flight" || again.code == "idempotency_store_unavailable"); i++ {
		time.Sleep(time.Second) // Retry-After, not a synchronisation
		again = fresh.call(e, key)
	}
	e.expect("the retry after the crash", again, "")
	if !fresh.waitRan(key, 30*time.Second) { // RAN follows DERIVED on the child's output
		e.failf("the retry's handler never said it ran")
		return
	}
	if second := fresh.derivedOf(key); first == "" || second != first || len(first) != 43 {
		e.failf("the handler derived %q before the crash and %q in the retry, want one 43-character id", first, second)
	}
}

// derivedOf is the id the child's handler derived for key.
func (ch *child) derivedOf(key string) string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.derived[key]
}

// expireRow makes key's row expired and its lease over, as time would.
func (e *env) expireRow(key string) {
	q := "UPDATE idempotency_keys SET locked_until = now() - interval '1 second', expires_at = now() - interval '1 second', retain_until = now() - interval '1 second' WHERE idem_key = $1"
	if e.c.store.mysql() {
		q = "UPDATE idempotency_keys SET locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, retain_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE idem_key = ?"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := e.se.direct.ExecContext(ctx, q, key)
	if err != nil {
		e.t.Fatalf("expire the key's row: %v", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		e.failf("expire the key's row: %d rows, want 1", n)
	}
}
