//go:build matrix

package matrix

import (
	"context"
	"fmt"
	"testing"

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
		{name: "kill-switch off", run: runKillSwitch},
	}
}

// runShortKey builds the entry point unscoped with MinKeyLength 4: the
// construction must fail. If it does not, a 4-byte key sent by two
// "clients" meets one record.
// TODO(merge): with W4's RouteConfig.Scoped, add the scoped case: a
// scoped entry point accepts a short key, and a call with an empty scope
// is refused (idempotency_scope_invalid) before any store call.
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

// runKillSwitch turns Config.Enabled off and sends one key twice: HTTP,
// gRPC and Connect run the handler both times (pass-through); Do runs it
// once and replays.
// TODO(merge): with W4's RouteConfig.FollowKillSwitch, add an Operation
// that sets it: Do then runs the function without a store call,
// CallInfo.Bypassed, idempotency_bypasses_total{reason="disabled"}.
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

// lent reports whether ctx carries a lent transaction.
func lent(ctx context.Context) bool {
	_, pg := idempotency.TxFromContext(ctx)
	_, sq := sqlstore.TxFromContext(ctx)
	return pg || sq
}
