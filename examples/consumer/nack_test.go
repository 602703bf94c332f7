package main

import (
	"net/url"
	"testing"

	"github.com/idemkit/idempotency/internal/tcpproxy"
)

// throughProxy returns the test's flags for consumer name with its
// database reached through a TCP proxy the test can cut.
func throughProxy(t *testing.T, e *env, name string, extra ...string) ([]string, *tcpproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.New(t, u.Host)
	flags := e.flags(name, extra...)
	for i, f := range flags {
		if f == "-database" {
			db, _ := url.Parse(flags[i+1])
			db.Host = proxy.Addr()
			flags[i+1] = db.String()
		}
	}
	return flags, proxy
}

// TestRedeliveryAfterNack: every answer the consumer nacks comes back,
// after its delay, and settles the payment once.
func TestRedeliveryAfterNack(t *testing.T) {
	t.Parallel()
	// The database is cut for real: the claim fails, the delivery is
	// nacked (store unavailable); after the link is back, a redelivery
	// settles it.
	t.Run("StoreDown", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		f := newFleet(t)
		flags, proxy := throughProxy(t, e, "a", "-workers", "1")
		f.start("a", flags)
		proxy.Cut()
		p := newPayment(t)
		e.publish(t, p)
		if ev := f.await(wait, isPayment("a", p.ID, "nak")); ev.Answer != "store_unavailable" {
			t.Fatalf("with the store cut: %v; want a nack, store unavailable", ev)
		}
		if n := e.ledgerRows(t, p.ID); n != 0 {
			t.Fatalf("with the store cut: %d ledger rows", n)
		}
		proxy.Restore()
		if ev := f.await(wait, isPayment("a", p.ID, "ack")); ev.Answer != "settled" || ev.Deliveries < 2 {
			t.Fatalf("after the outage: %v; want a redelivery, settled", ev)
		}
		e.settled(t)
		if n := e.ledgerRows(t, p.ID); n != 1 {
			t.Fatalf("%d ledger rows, want exactly 1", n)
		}
	})
	// The function has written the entry; the replies of the record and
	// the COMMIT are lost on the way back, so the consumer cannot know
	// whether it committed. It nacks; the redelivery replays if it did and
	// settles if it did not: one entry either way.
	t.Run("CommitReplyLost", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		f := newFleet(t)
		flags, proxy := throughProxy(t, e, "a", "-workers", "1")
		a := f.start("a", flags, "EXAMPLE_CONSUMER_HOLD=ledger")
		p := newPayment(t)
		e.publish(t, p)
		f.await(wait, func(ev event) bool { return ev.Msg == "hold" && ev.Key == p.ID })
		proxy.DropReplies()
		a.release(t)
		if ev := f.await(wait, isPayment("a", p.ID, "nak")); ev.Answer != "store_unavailable" {
			t.Fatalf("with the commit's reply lost: %v; want a nack, store unavailable", ev)
		}
		ev := f.await(wait, isPayment("a", p.ID, "ack"))
		if ev.Answer != "settled" && ev.Answer != "replayed" {
			t.Fatalf("the redelivery: %v; want it settled or replayed", ev)
		}
		t.Logf("the redelivery was %s (the lost reply's COMMIT %s)", ev.Answer, map[bool]string{true: "had committed", false: "had not run"}[ev.Answer == "replayed"])
		e.settled(t)
		if n := e.ledgerRows(t, p.ID); n != 1 {
			t.Fatalf("%d ledger rows, want exactly 1", n)
		}
	})
	// A delivery is redelivered (its ack wait passed) while the first is
	// still inside its function: the key is in flight, the redelivery is
	// nacked with a delay, and the first's commit settles the payment.
	// Which of the two holds is whichever reached its claim first: on a
	// loaded machine the first delivery can reach it after the ack wait
	// (1 s) has sent the redelivery to the other worker, and then the
	// first delivery is the one nacked.
	t.Run("InFlight", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		f := newFleet(t)
		a := f.start("a", e.flags("a", "-workers", "2"), "EXAMPLE_CONSUMER_HOLD=ledger")
		p := newPayment(t)
		e.publish(t, p)
		hold := f.await(wait, func(ev event) bool { return ev.Msg == "hold" && ev.Key == p.ID })
		ev := f.await(wait, isPayment("a", p.ID, "nak"))
		if ev.Answer != "in_flight" || ev.Deliveries == hold.Deliveries {
			t.Fatalf("the other delivery while delivery %d runs: %v; want a nack, in flight", hold.Deliveries, ev)
		}
		a.release(t)
		if ev := f.await(wait, isPayment("a", p.ID, "ack")); ev.Answer != "settled" && ev.Answer != "replayed" {
			t.Fatalf("after the release: %v; want an ack", ev)
		}
		e.settled(t)
		if n := e.ledgerRows(t, p.ID); n != 1 {
			t.Fatalf("%d ledger rows, want exactly 1", n)
		}
	})
}
