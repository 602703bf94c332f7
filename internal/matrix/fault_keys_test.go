//go:build matrix

package matrix

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// Keys and the kill-switch: "One key space" (settled-r4 item 7: an
// unscoped entry point with MinKeyLength < 16 is refused at construction)
// and "The kill-switch is for endpoints" (item 8: HTTP, gRPC and Connect
// pass through; Do keeps deduplicating unless RouteConfig.FollowKillSwitch).

func keyFaults() []*fault {
	return []*fault{
		{name: "short unscoped key", run: runShortKey},
		{name: "short scoped key", run: runScopedKey},
		{name: "kill-switch off", run: runKillSwitch},
		{name: "kill-switch, Do follows it", na: func(c column) string {
			if c.entry != entryDo {
				return naFollow
			}
			return ""
		}, run: runFollowKillSwitch},
	}
}

// runShortKey builds the entry point unscoped with MinKeyLength 4: the
// construction must fail. If it does not, a 4-byte key sent by two
// "clients" meets one record.
func runShortKey(t *testing.T, c cell) {
	e, err := tryEnv(t, c, envOpts{route: func(rc *idempotency.RouteConfig) {
		rc.MinKeyLength = 4
		if c.entry == entryHTTP {
			rc.KeyFormat = idempotency.KeyOpaque
		}
	}})
	if err != nil {
		return // refused at construction, as the contract says
	}
	e.failf("an unscoped entry point with MinKeyLength 4 was built")
	a := e.send("abcd")
	b := e.send("abcd")
	if a.handler && b.handler && b.replayed {
		e.failf("two callers of the short key \"abcd\" met one record: the second got the first's answer")
	}
}

// runScopedKey builds the entry point Scoped with MinKeyLength 4 (item 7):
// it must be built; two users' calls with the same short key each run
// once and never meet; a call with no scope is refused with
// idempotency_scope_invalid before any store call (no row in the ""
// scope, no run).
func runScopedKey(t *testing.T, c cell) {
	e := newEnv(t, c, envOpts{
		route: func(rc *idempotency.RouteConfig) {
			rc.Scoped = true
			rc.MinKeyLength = 4
			if c.entry == entryHTTP {
				rc.KeyFormat = idempotency.KeyOpaque
			}
		},
		cfg: func(cfg *idempotency.Config) { cfg.Scope = scopeOf },
	})
	const key = "abcd"
	a, b := e.sendAsUnrun("alice", key), e.sendAsUnrun("bob", key)
	e.expect("alice's call", a, "")
	e.expect("bob's call, same key", b, "")
	if b.replayed {
		e.failf("bob's call with alice's key %q was answered with alice's record", key)
	}
	if n := e.executions(key); n != 2 {
		e.failf("key %q in two scopes: %d executions, want 2 (one per user)", key, n)
	}
	again := e.sendAsUnrun("alice", key)
	if !again.handler || !again.replayed {
		e.failf("alice's retry: %v, want her replay", again)
	}
	none := e.sendAs("", key)
	e.expect("a call without a scope", none, "idempotency_scope_invalid")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := e.se.store.ExportScope(ctx, "")
	if err != nil {
		e.failf("export the unscoped rows: %v", err)
	}
	for _, r := range rows {
		if r.Key == key {
			e.failf("the call without a scope reached the store: a row for %q in the \"\" scope", key)
		}
	}
	if n := e.executions(key); n != 2 {
		e.failf("after the unscoped call: %d executions of %q, want still 2", n, key)
	}
}

// runKillSwitch turns Config.Enabled off and sends one key twice: HTTP,
// gRPC and Connect run the handler both times (pass-through); Do runs it
// once and replays.
func runKillSwitch(t *testing.T, c cell) {
	h := func(ctx context.Context, hc *hctx) (int, []byte) {
		if lent(ctx) {
			if err := hc.effect(ctx); err != nil {
				return failure(err)
			}
		}
		return 201, fmt.Appendf(nil, `{"ok":true,"key":%q}`, hc.key)
	}
	e := newEnv(t, c, envOpts{h: h})
	e.enabled.Store(false)
	key := newKey()
	a, b := e.send(key), e.send(key)
	e.expect("first call, switch off", a, "")
	e.expect("second call, switch off", b, "")
	if c.entry == entryDo {
		if b.handler && !b.replayed {
			e.failf("Do with the switch off: the second call ran again (a consumer must keep deduplicating)")
		}
		if n := e.started(key); n != 1 {
			e.failf("Do with the switch off: the function ran %d times, want 1", n)
		}
		e.atMostOnce(key, 1)
		return
	}
	if n := e.started(key); n != 2 {
		e.failf("%s with the switch off: the handler ran %d times, want 2 (pass-through)", c.entry, n)
	}
	if b.replayed {
		e.failf("%s with the switch off: the second call was a replay, want pass-through", c.entry)
	}
	if n := e.disabled.Load() + e.passed.Load(); n != 2 {
		e.failf("%s with the switch off: %d pass-through Observations (bypassed, reason disabled), want 2", c.entry, n)
	}
}

// naFollow: only an Operation has RouteConfig.FollowKillSwitch.
const naFollow = "RouteConfig.FollowKillSwitch is an Operation's (Do) only; the other entry points always follow the switch"

// runFollowKillSwitch: an Operation with FollowKillSwitch, switch off,
// runs its function on every call without a store call: CallInfo.Bypassed,
// idempotency_bypasses_total{reason="disabled"} (settled-r4 item 8).
func runFollowKillSwitch(t *testing.T, c cell) {
	// A transactional route still lends its transaction with the switch
	// off (serve.go's passThrough: the handler keeps one shape), with no
	// claim in it.
	h := func(ctx context.Context, hc *hctx) (int, []byte) {
		if lent(ctx) {
			if err := hc.effect(ctx); err != nil {
				return failure(err)
			}
		}
		return 201, fmt.Appendf(nil, `{"ok":true,"key":%q}`, hc.key)
	}
	e := newEnv(t, c, envOpts{h: h, route: func(rc *idempotency.RouteConfig) { rc.FollowKillSwitch = true }})
	e.enabled.Store(false)
	key := newKey()
	for i := range 2 {
		a := e.send(key)
		e.expect(fmt.Sprintf("call %d, switch off", i), a, "")
		if a.err == nil && !a.bypassed {
			e.failf("call %d, switch off: CallInfo.Bypassed unset", i)
		}
	}
	if n := e.started(key); n != 2 {
		e.failf("the function ran %d times, want 2 (it follows the switch)", n)
	}
	if n := e.counter("idempotency_bypasses_total", func(l, v string) bool { return l != "reason" || v == "disabled" }); n != 2 {
		e.failf("idempotency_bypasses_total{reason=disabled} = %v, want 2", n)
	}
}

// lent reports whether ctx carries a lent transaction.
func lent(ctx context.Context) bool {
	_, pg := idempotency.TxFromContext(ctx)
	_, sq := sqlstore.TxFromContext(ctx)
	return pg || sq
}
