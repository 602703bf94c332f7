package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idempotency/examples/consumer/payment"
)

// wait bounds every wait for a consumer's event: generous, never a
// measure of speed (the ack wait is 1s, nack delays at most 200ms).
const wait = time.Minute

func newPayment(t *testing.T) payment.Payment {
	return payment.Payment{ID: "pay-" + randomHex(t), UserID: "user-1", AmountCents: 1250, Currency: "EUR"}
}

// TestRedeliveryAfterKill kills -9 the consumer while its function is
// inside the ledger write (the entry written in the lent transaction, not
// committed): the server rolls the transaction back with the claim, and
// the redelivery, after the ack wait, settles the payment at once, once.
func TestRedeliveryAfterKill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := newFleet(t)
	a := f.start("a", e.flags("a", "-workers", "1"), "EXAMPLE_CONSUMER_HOLD=ledger")
	p := newPayment(t)
	e.publish(t, p)
	f.await(wait, func(ev event) bool { return ev.Msg == "hold" && ev.Point == "ledger" && ev.Key == p.ID })
	if !e.inLedgerWrite(t, "a") || e.ledgerRows(t, p.ID) != 0 {
		t.Fatalf("at the hold: in the ledger write %v, %d committed rows; want inside the transaction, nothing committed",
			e.inLedgerWrite(t, "a"), e.ledgerRows(t, p.ID))
	}
	a.kill9(t)
	if n := e.ledgerRows(t, p.ID); n != 0 {
		t.Fatalf("after kill -9: %d ledger rows, want 0", n)
	}
	f.start("b", e.flags("b"))
	ev := f.await(wait, isPayment("b", p.ID, "ack"))
	if ev.Answer != "settled" || ev.Deliveries < 2 {
		t.Fatalf("the redelivery: %v; want settled on delivery 2 or later", ev)
	}
	e.settled(t)
	if n := e.ledgerRows(t, p.ID); n != 1 {
		t.Fatalf("%d ledger rows, want exactly 1", n)
	}
}

// TestRedeliveryAfterAckTimeout holds a settled payment before its ack
// until the ack wait passes: JetStream redelivers it to another worker,
// which gets the replay and acks it; the ledger entry exists once.
func TestRedeliveryAfterAckTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := newFleet(t)
	a := f.start("a", e.flags("a", "-workers", "2"), "EXAMPLE_CONSUMER_HOLD=ack")
	p := newPayment(t)
	e.publish(t, p)
	// The held delivery is whichever settled first: on a loaded machine the
	// first delivery can reach its claim after the ack wait (1 s) has sent
	// the redelivery to the other worker.
	hold := f.await(wait, func(ev event) bool { return ev.Msg == "hold" && ev.Point == "ack" && ev.Key == p.ID })
	if n := e.ledgerRows(t, p.ID); n != 1 {
		t.Fatalf("before the ack: %d ledger rows, want the committed 1", n)
	}
	ev := f.await(wait, isPayment("a", p.ID, "ack"))
	if ev.Answer != "replayed" || ev.Deliveries == hold.Deliveries {
		t.Fatalf("after the ack wait: %v; want the other delivery than the held %d, replayed and acked", ev, hold.Deliveries)
	}
	a.release(t)
	if ev := f.await(wait, isPayment("a", p.ID, "ack")); ev.Answer != "settled" || ev.Deliveries != hold.Deliveries {
		t.Fatalf("the held delivery %d: %v; want its own ack, settled", hold.Deliveries, ev)
	}
	e.settled(t)
	if n := e.ledgerRows(t, p.ID); n != 1 {
		t.Fatalf("%d ledger rows, want exactly 1", n)
	}
}

// TestStopWaitsForCalls: SIGTERM while a payment is inside its function;
// the consumer stops fetching, the payment settles and is acked, and only
// then does the process exit, with status 0: a stop fails no key.
func TestStopWaitsForCalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := newFleet(t)
	a := f.start("a", e.flags("a", "-workers", "2"), "EXAMPLE_CONSUMER_HOLD=ledger")
	p := newPayment(t)
	e.publish(t, p)
	f.await(wait, func(ev event) bool { return ev.Msg == "hold" && ev.Key == p.ID })
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	f.await(wait, func(ev event) bool { return ev.Proc == "a" && ev.Msg == "stopping" })
	select {
	case <-a.exited:
		t.Fatal("the consumer exited with a payment inside its function")
	default:
	}
	a.release(t)
	// An exit before this ack fails the await: the process must wait.
	if ev := f.await(wait, isPayment("a", p.ID, "ack")); ev.Answer != "settled" {
		t.Fatalf("after the stop: %v; want the held payment settled and acked", ev)
	}
	a.ending.Store(true)
	f.await(wait, func(ev event) bool { return ev.Proc == "a" && ev.Msg == "stopped" })
	<-a.exited
	if a.err != nil {
		t.Fatalf("exit: %v, want status 0", a.err)
	}
	e.settled(t)
	if n := e.ledgerRows(t, p.ID); n != 1 {
		t.Fatalf("%d ledger rows, want exactly 1", n)
	}
}

// TestKillSwitchKeepsDeduplicating runs the consumer with the HTTP
// kill-switch off in its environment (FLAG_IDEMPOTENCY_MIDDLEWARE=0) and
// redelivers a settled payment (held before its ack past the ack wait):
// the switch is for endpoints, so the redelivery is replayed, never
// charged again, and the ledger entry exists once.
func TestKillSwitchKeepsDeduplicating(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := newFleet(t)
	a := f.start("a", e.flags("a", "-workers", "2"), "FLAG_IDEMPOTENCY_MIDDLEWARE=0", "EXAMPLE_CONSUMER_HOLD=ack")
	p := newPayment(t)
	e.publish(t, p)
	hold := f.await(wait, func(ev event) bool { return ev.Msg == "hold" && ev.Point == "ack" && ev.Key == p.ID })
	ev := f.await(wait, isPayment("a", p.ID, "ack"))
	if ev.Answer != "replayed" || ev.Deliveries == hold.Deliveries {
		t.Fatalf("the redelivery with the kill-switch off: %v; want the other delivery than the held %d, replayed (%d ledger rows)",
			ev, hold.Deliveries, e.ledgerRows(t, p.ID))
	}
	a.release(t)
	if ev := f.await(wait, isPayment("a", p.ID, "ack")); ev.Answer != "settled" || ev.Deliveries != hold.Deliveries {
		t.Fatalf("the held delivery %d: %v; want its own ack, settled", hold.Deliveries, ev)
	}
	e.settled(t)
	if n := e.ledgerRows(t, p.ID); n != 1 {
		t.Fatalf("kill-switch off: %d ledger rows, want exactly 1 (a double charge)", n)
	}
}
