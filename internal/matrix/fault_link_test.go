//go:build matrix

package matrix

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// The link between the store and its database, cut (connections refused
// and open ones closed, internal/tcpproxy) before the claim, mid-handler
// and at the commit, and a commit whose reply is lost. A fail-open route
// bypasses only the cut before the claim, where its probe's dial fails
// (settled-r4 item 4); no key runs twice; on lib/pq the assertions are the
// answer's deadline only, not the connection's release (item 6).

func linkFaults() []*fault {
	net := needsDB(naMemoryNet)
	return []*fault{
		{name: "link cut before claim", na: net, run: runCutBeforeClaim},
		{name: "link cut mid-handler", na: net, run: func(t *testing.T, c cell) {
			runCutDuring(t, c, func(e *env) { e.se.proxy.Cut() }, "mid-handler")
		}},
		{name: "link cut at commit", na: net, run: func(t *testing.T, c cell) {
			runCutDuring(t, c, func(e *env) { e.se.proxy.Cut() }, "at-commit")
		}},
		{name: "black hole at commit", na: net, run: func(t *testing.T, c cell) {
			runCutDuring(t, c, func(e *env) { e.se.proxy.Blackhole() }, "black-hole")
		}},
		{name: "lost commit reply", na: net, run: func(t *testing.T, c cell) {
			runCutDuring(t, c, loseCommitReply, "lost-reply")
		}},
	}
}

// runCutBeforeClaim: with the link cut, a fail-closed call answers 503
// and runs nothing; a fail-open ordinary call bypasses (its probe's dial
// failed) and runs once. After the link is back, the fail-closed key
// executes once, and a new key of a fail-open route is deduplicated again.
func runCutBeforeClaim(t *testing.T, c cell) {
	e := newEnv(t, c, envOpts{})
	key := newKey()
	e.se.proxy.Cut()
	a := e.send(key)
	e.within("call on a cut link", a, 0)
	open := c.v.open && !c.v.tx
	if open {
		e.expect("fail-open call on a cut link", a, "")
		e.noBypassWithoutProbe() // the bypass followed a failed probe (settled-r4 item 4)
		if e.bypassed.Load() != 1 {
			e.failf("fail-open call on a cut link: %d bypasses counted, want 1", e.bypassed.Load())
		}
		e.bypassMetric()
		if c.entry == entryDo && !a.bypassed {
			e.failf("Do on a cut link ran the function without CallInfo.Bypassed")
		}
	} else {
		e.expect("call on a cut link", a, "idempotency_store_unavailable")
		e.noBypass()
		e.atMostOnce(key, 0)
	}
	e.se.proxy.Restore()
	if open {
		key = newKey()
	}
	before, probes := e.bypassed.Load(), e.probeFailures()
	again := e.retry503(key)
	e.expect("call after the link is back", again, "")
	if e.bypassed.Load() != before && e.probeFailures() == probes {
		e.failf("call after the link is back bypassed, though no probe failed again")
	}
	e.atMostOnce(key, 1)
}

// runCutDuring: the handler makes its effect, then (first run only) the
// link breaks: mid-handler (the test breaks it while the handler waits),
// at the commit (the handler breaks it as it returns: cut, or black-holed
// so that nothing answers and only the deadline ends the commit) or with
// the reply of the next statement, the commit or the record, lost. A transactional call
// answers 503; an ordinary one the handler's answer or 503. After the
// link is back, the retry executes once at most: a transactional key whose
// commit was lost replays, one whose commit failed executes, an ordinary
// key never runs again.
func runCutDuring(t *testing.T, c cell, brk func(*env), when string) {
	entered, resume := make(chan struct{}), make(chan struct{})
	h := func(ctx context.Context, hc *hctx) (int, []byte) {
		if err := hc.effect(ctx); err != nil {
			return failure(err)
		}
		if hc.e.started(hc.key) == 1 {
			switch when {
			case "mid-handler":
				close(entered)
				<-resume
			default:
				brk(hc.e)
			}
		}
		return 201, fmt.Appendf(nil, `{"ok":true,"key":%q}`, hc.key)
	}
	e := newEnv(t, c, envOpts{h: h})
	key := newKey()
	done := make(chan answer, 1)
	go func() { done <- e.send(key) }()
	if when == "mid-handler" {
		select {
		case <-entered:
			brk(e)
			close(resume)
		case a := <-done:
			e.failf("the call answered before its handler ran: %v", a)
			return
		}
	}
	a := <-done
	e.within("call whose link broke "+when, a, 0)
	if c.v.tx {
		e.expect("transactional call whose link broke "+when, a, "idempotency_store_unavailable")
	} else if !(a.err == nil && (a.handler && a.status < 300 || a.code == "idempotency_store_unavailable")) {
		e.failf("call whose link broke %s: want the handler's answer or idempotency_store_unavailable, got %v", when, a)
	}
	e.noBypass()
	e.se.proxy.Restore()
	again := e.retry503(key)
	e.within("retry", again, 0)
	switch {
	case c.v.tx && when == "lost-reply":
		e.expect("retry of a lost commit reply", again, "")
		if again.handler && !again.replayed {
			e.failf("retry of a lost commit reply: ran again: %v", again)
		}
		e.atMostOnce(key, 1)
	case c.v.tx:
		e.expect("retry of a failed commit", again, "")
		e.atMostOnce(key, 1)
	default:
		want := []string{"idempotency_in_flight", "idempotency_outcome_unknown"}
		if !(again.handler && again.replayed) && !slices.Contains(want, again.code) {
			e.failf("retry: want a replay, idempotency_in_flight or idempotency_outcome_unknown, got %v", again)
		}
		e.atMostOnce(key, 1)
	}
}

// loseCommitReply loses the reply to the route's COMMIT, which commits
// (transactional); on an ordinary route, the reply to the record, the
// next statement on any live connection.
func loseCommitReply(e *env) {
	if e.c.v.tx {
		after := 0
		if e.c.store == storePgx {
			after = 1 // pgx prepares the batch (COMMIT's text), then runs it by name
		}
		e.se.proxy.DropReplyTo("commit", after)
		return
	}
	e.se.proxy.DropReplies()
}

// retry503 sends key until it gets an answer other than 503, as a client
// honouring Retry-After: 1 would (at most 5 times): connections the proxy
// broke may fail the first calls after the link is back.
func (e *env) retry503(key string) answer {
	var a answer
	for range 5 {
		a = e.send(key)
		if a.code != "idempotency_store_unavailable" {
			return a
		}
		time.Sleep(time.Second) // the contract's Retry-After: 1, not a synchronisation
	}
	return a
}
