//go:build matrix

package matrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemrpc"
)

// Past our boundary (#35, settled-r4 items 16 and 17): a handler whose
// downstream outcome is unknown ends Unsettled (503, Retry-After 1,
// nothing recorded; the lease ends, or a transactional route rolls back),
// and the retry reconciles the key through the route's hook: done
// replays the hook's answer, not done runs the handler, unknown and a
// hook that hangs answer outcome_unknown within ReconcileTimeout.

// statusUnsettled is the status with which a behaviour asks its entry
// adapter to end Unsettled, in that entry point's terms.
const statusUnsettled = 999

// reconcileWait is the reconcile cells' ReconcileTimeout, and
// reconcileStoreTimeout their store timeout: a reconciling retry makes
// three store calls and asks the hook, so on a loaded machine the
// matrix's 400ms would answer 503 for a slow store, not for the contract.
const (
	reconcileWait         = 300 * time.Millisecond
	reconcileStoreTimeout = time.Second
)

// naTxReconcile: Unsettled rolls a transactional route back, so it leaves
// no stale key to reconcile.
const naTxReconcile = "a transactional route rolls back on Unsettled: no stale key is left to reconcile"

func reconcileFaults() []*fault {
	noTx := func(c column) string {
		if c.v.tx {
			return naTxReconcile
		}
		return ""
	}
	return []*fault{
		{name: "handler unsettled", run: runUnsettled},
		{name: "reconcile: done", na: noTx, run: func(t *testing.T, c cell) { runReconcile(t, c, "done") }},
		{name: "reconcile: not done", na: noTx, run: func(t *testing.T, c cell) { runReconcile(t, c, "not done") }},
		{name: "reconcile: unknown", na: noTx, run: func(t *testing.T, c cell) { runReconcile(t, c, "unknown") }},
		{name: "reconcile: hook hangs", na: noTx, run: func(t *testing.T, c cell) { runReconcile(t, c, "hang") }},
	}
}

// unsettledOnce is a behaviour whose first run for a key makes its effect
// and ends Unsettled, and whose later runs record.
func unsettledOnce(ctx context.Context, h *hctx) (int, []byte) {
	if h.e.started(h.key) == 1 {
		if err := h.effect(ctx); err != nil {
			return failure(err)
		}
		return statusUnsettled, nil
	}
	return record(ctx, h)
}

// runUnsettled: the first call answers 503 store_unavailable; the retry
// answers outcome_unknown (no hook) on an ordinary route, and runs the
// handler once more on a transactional one, whose first run rolled back.
func runUnsettled(t *testing.T, c cell) {
	e := newEnv(t, c, envOpts{h: unsettledOnce, storeTimeout: reconcileStoreTimeout})
	key := newKey()
	first := e.send(key)
	e.expect("unsettled call", first, "idempotency_store_unavailable")
	e.within("unsettled call", first, 0)
	retry := e.send(key)
	if c.v.tx {
		e.expect("retry after a rolled-back Unsettled", retry, "")
		e.atMostOnce(key, 1)
	} else {
		e.expect("retry of an Unsettled key without a hook", retry, "idempotency_outcome_unknown")
		e.atMostOnce(key, 1)
	}
	e.within("retry", retry, 0)
	e.noBypass()
}

// runReconcile leaves a key Unsettled and retries it with a hook that
// answers kind.
func runReconcile(t *testing.T, c cell, kind string) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	hook := func(_ context.Context, info idempotency.ReconcileInfo) (any, error) {
		switch kind {
		case "done":
			return doneValue(c.entry, fmt.Appendf(nil, `{"ok":true,"key":%q,"venue":true}`, info.Key)), nil
		case "not done":
			return nil, idempotency.ErrNotDone
		case "hang":
			<-hang // ignores its context
		}
		return nil, errors.New("venue: lookup failed")
	}
	e := newEnv(t, c, envOpts{h: unsettledOnce, storeTimeout: reconcileStoreTimeout, route: func(rc *idempotency.RouteConfig) {
		rc.Reconcile, rc.ReconcileTimeout = hook, reconcileWait
	}})
	key := newKey()
	e.expect("unsettled call", e.send(key), "idempotency_store_unavailable")
	retry := e.send(key)
	e.within("reconciling retry", retry, reconcileWait)
	switch kind {
	case "done":
		e.expect("retry, done", retry, "")
		if retry.err == nil && !retry.replayed {
			e.failf("retry, done: want the hook's answer as a replay, got %v", retry)
		}
		e.atMostOnce(key, 1)
	case "not done":
		e.expect("retry, not done", retry, "")
		if retry.replayed {
			e.failf("retry, not done: want the handler's own answer, got a replay")
		}
		if n := e.started(key); n != 2 { // the Unsettled run and this one
			e.failf("key %s: the handler ran %d times, want 2 (the Unsettled run, then the not-done run)", key[:8], n)
		}
		if again := e.send(key); again.err == nil && !again.replayed {
			e.failf("after not done: want a replay, got %v", again)
		}
	default:
		e.expect("retry, "+kind, retry, "idempotency_outcome_unknown")
		e.atMostOnce(key, 1)
	}
	e.noBypass()
}

// doneValue is a done hook's answer with body, in the entry point's terms.
func doneValue(entry entryKind, body []byte) any {
	switch entry {
	case entryDo:
		return json.RawMessage(body)
	case entryGRPC:
		return idemrpc.Record(0, &testpb.SimpleResponse{Payload: &testpb.Payload{Body: body}}, "", nil, http.Header{})
	case entryConnect:
		return idemrpc.Record(0, wrapperspb.Bytes(body), "", nil, http.Header{})
	}
	return idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
}
