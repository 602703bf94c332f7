//go:build matrix

package matrix

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// Keys in time: a key past its TTL under RouteConfig.ExpiredRefuse is a
// tombstone (DESIGN.md "Keys in time", settled-r4 item 20): every entry
// point answers it idempotency_key_expired, whatever the body, and runs
// nothing; cleanup purges its response and keeps the row until the grace
// ends, then deletes it, and the key runs again.

func expiredFaults() []*fault {
	return []*fault{{name: "key expired with ExpiredRefuse", na: needsDB(naExpiredMemory), run: runExpiredRefuse}}
}

// naExpiredMemory: the cell moves the row's times back in SQL; the memory
// store's clock is the package's own (the root's TestExpiredRefuse and the
// conformance kit's Tombstone area run it with a fake clock and tiny TTLs).
const naExpiredMemory = "time passes by moving the row's times back in SQL; the memory store's tombstones are tested with its fake clock (TestExpiredRefuse, idempotencytest Tombstone)"

// runExpiredRefuse: one call (a 503 of a loaded machine's store timeout,
// before anything ran, is retried as a client honouring Retry-After
// would), then the row's times an hour and a minute
// back (past the TTL of 1h): the same body and another get
// idempotency_key_expired; cleanup keeps the row without its response;
// another hour back (past the grace of 1h), cleanup deletes it and the
// key runs again.
func runExpiredRefuse(t *testing.T, c cell) {
	e := newEnv(t, c, envOpts{route: func(rc *idempotency.RouteConfig) {
		rc.TTL, rc.Expired, rc.Grace = time.Hour, idempotency.ExpiredRefuse, time.Hour
	}})
	key := newKey()
	e.expect("first call", e.sendUnrun(key), "")
	s := e.session()
	age := `UPDATE idempotency_keys SET created_at = created_at - interval '61 minutes', locked_at = locked_at - interval '61 minutes',
	locked_until = locked_until - interval '61 minutes', expires_at = expires_at - interval '61 minutes',
	retain_until = retain_until - interval '61 minutes'`
	if c.store.mysql() {
		age = `UPDATE idempotency_keys SET created_at = created_at - INTERVAL 61 MINUTE, locked_at = locked_at - INTERVAL 61 MINUTE,
	locked_until = locked_until - INTERVAL 61 MINUTE, expires_at = expires_at - INTERVAL 61 MINUTE,
	retain_until = retain_until - INTERVAL 61 MINUTE`
	}
	e.outsideExec(s, age)
	e.expect("the same body past the TTL", e.retry503(key), "idempotency_key_expired")
	e.expect("another body past the TTL", e.sendBody(key, []byte(`{"amount":11}`)), "idempotency_key_expired")
	e.atMostOnce(key, 1)

	cleanup := func(what string) (rows, response int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := e.mw.Cleanup(ctx, 0); err != nil {
			e.failf("%s: Cleanup: %v", what, err)
		}
		err := s.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(response_body) + COUNT(response_body_raw) + COUNT(response_headers) + COUNT(seal_key_id)
	FROM idempotency_keys`).Scan(&rows, &response)
		if err != nil {
			e.t.Fatalf("%s: count the rows: %v", what, err)
		}
		return rows, response
	}
	if rows, response := cleanup("at expiry"); rows != 1 || response != 0 {
		e.failf("cleanup at expiry left %d rows with %d response columns, want the row without its response", rows, response)
	}
	e.expect("a purged tombstone", e.retry503(key), "idempotency_key_expired")
	e.outsideExec(s, age)
	if rows, _ := cleanup("past the grace"); rows != 0 {
		e.failf("cleanup past the grace left %d rows, want none", rows)
	}
	e.expect("the key after the grace", e.retry503(key), "")
	if n := e.executions(key); n != 2 { // once before the TTL, once after the grace: a new key
		e.failf("key %s: %d executions after the grace, want 2", key[:8], n)
	}
}
