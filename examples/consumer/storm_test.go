package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/examples/consumer/payment"
)

// stormWait bounds the storm.
var stormWait = 3 * time.Minute

// stormPayments is how many good payments the storm publishes.
const stormPayments = 200

// TestRedeliveryStorm publishes payments with the publisher, plus declined
// and poison messages, and consumes them with two consumer processes
// whose chaos loses acks and nacks deliveries mid-function (so
// redeliveries land on the other process while the first still holds the
// key); one of them is killed -9 mid-storm and replaced. Every payment ends
// exactly once in the ledger (settled or declined) or in the dead-letter
// stream with its reason; none is lost.
func TestRedeliveryStorm(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	good := e.publishWithCommand(t, "-n", fmt.Sprint(stormPayments), "-users", "20")
	declined := append(e.publishWithCommand(t, "-id", "pay-declined-amount", "-amount", "0"),
		e.publishWithCommand(t, "-id", "pay-declined-currency", "-currency", "XXX")...)
	poison := e.publishPoison(t) // reason -> the dead letter's original id ("" for none)

	st := e.storm(t, append(append(append([]string{}, good...), declined...), values(poison)...))
	e.settled(t)
	t.Logf("%d deliveries (%d redeliveries) for %d messages: %d replays, %d in-flight nacks, %d chaos events, %d payments handled by two processes or more",
		st.deliveries, st.redeliveries, stormPayments+len(declined)+len(poison), st.replays, st.inFlight, st.chaos, st.shared())
	if st.replays == 0 || st.redeliveries == 0 || st.shared() == 0 {
		t.Errorf("no storm: %d replays, %d redeliveries, %d payments seen by two processes", st.replays, st.redeliveries, st.shared())
	}
	e.checkLedger(t, good, declined)
	e.checkDeadLetters(t, poison)
}

// storm runs the two chaotic consumers (a, killed -9 after a quarter of
// the acks and replaced by a2, and b) until the durable consumer holds
// nothing, and counts what they logged. The logs tell the progress; the
// broker tells the end: a message that the killed process acked just
// before its SIGKILL has no log line.
func (e *env) storm(t *testing.T, ids []string) stormStats {
	t.Helper()
	f := newFleet(t)
	chaos := []string{"EXAMPLE_CONSUMER_CHAOS=0.3"}
	a := f.start("a", e.flags("a"), append(chaos, "EXAMPLE_CONSUMER_SEED=1")...)
	f.start("b", e.flags("b"), append(chaos, "EXAMPLE_CONSUMER_SEED=2")...)
	want := map[string]bool{} // keys without a logged final verdict
	for _, id := range ids {
		want[id] = true
	}
	st := stormStats{procs: map[string]map[string]bool{}}
	deadline := time.Now().Add(stormWait)
	for len(want) > 0 {
		ev, ok := f.next(time.After(250 * time.Millisecond))
		if !ok { // quiet: done, or still waiting for ack waits and nack delays
			if e.drained(t) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %v, %d messages have no final verdict: %v", stormWait, len(want), keys(want))
			}
			continue
		}
		st.count(ev)
		if ev.Msg == "payment" && (ev.Verdict == "ack" || ev.Verdict == "dead_letter") {
			delete(want, ev.Key)
		}
		if ev.Msg == "exited" && ev.Proc != "a" {
			t.Fatalf("%s exited during the storm", ev.Proc)
		}
		if st.acks >= stormPayments/4 && !a.ending.Load() {
			a.kill9(t) // mid-storm: whatever it held is redelivered after the ack wait
			t.Logf("killed a (kill -9) after %d acks", st.acks)
			f.start("a2", e.flags("a2"), append(chaos, "EXAMPLE_CONSUMER_SEED=3")...)
		}
	}
	if len(want) > 0 {
		t.Logf("%d messages settled with no log line (acked by a as it was killed): %v", len(want), keys(want))
	}
	return st
}

// stormStats counts what the consumers logged.
type stormStats struct {
	deliveries, redeliveries, replays, inFlight, chaos, acks int
	procs                                                    map[string]map[string]bool // key -> processes that handled it
}

func (s *stormStats) count(ev event) {
	switch {
	case ev.Msg == "chaos":
		s.chaos++
	case ev.Msg != "payment":
		return
	}
	if ev.Msg == "payment" || ev.Kind == chaosLostAck || ev.Kind == chaosNoAck { // one line per delivery
		s.deliveries++
		if ev.Deliveries > 1 {
			s.redeliveries++
		}
		if ev.Answer == "replayed" {
			s.replays++
		}
		if ev.Answer == "in_flight" {
			s.inFlight++
		}
		if ev.Verdict == "ack" {
			s.acks++
		}
	}
	if s.procs[ev.Key] == nil {
		s.procs[ev.Key] = map[string]bool{}
	}
	s.procs[ev.Key][ev.Proc] = true
}

func (s *stormStats) shared() int {
	n := 0
	for _, p := range s.procs {
		if len(p) > 1 {
			n++
		}
	}
	return n
}

func values(m map[string]string) []string {
	var vs []string
	for _, v := range m {
		vs = append(vs, v)
	}
	return vs
}

func keys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// publishWithCommand runs the publisher and returns the ids it printed.
func (e *env) publishWithCommand(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command(bin.publish, append([]string{"-nats", e.natsURL, "-stream", e.streams.Name}, args...)...).Output()
	if err != nil {
		t.Fatalf("publish %v: %v", args, err)
	}
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.Contains(line, "dropped") {
			t.Fatalf("publish: %s", line)
		}
		ids = append(ids, strings.Fields(line)[0])
	}
	return ids
}

// publishPoison publishes what the consumer must dead-letter, and returns,
// by the reason it must give, the id each dead letter names.
func (e *env) publishPoison(t *testing.T) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	long := "pay-" + strings.Repeat("x", 300)
	poison := map[string]struct {
		id   string
		body string
	}{
		"no_message_id":  {"", `{"id":"","user_id":"user-1","amount_cents":100,"currency":"EUR"}`},
		"malformed_body": {"pay-malformed", `not json`},
		"invalid_key":    {long, `{"id":"` + long + `","user_id":"user-1","amount_cents":100,"currency":"EUR"}`},
	}
	reasons := map[string]string{}
	for reason, m := range poison {
		msg := nats.NewMsg(e.streams.Subject())
		msg.Data = []byte(m.body)
		var opts []jetstream.PublishOpt
		if m.id != "" {
			opts = append(opts, jetstream.WithMsgID(m.id))
		}
		if _, err := e.js.PublishMsg(ctx, msg, opts...); err != nil {
			t.Fatal(err)
		}
		reasons[reason] = m.id
	}
	return reasons
}

// checkLedger: each good payment settled exactly once, each declined one
// declined exactly once, and nothing else booked.
func (e *env) checkLedger(t *testing.T, good, declined []string) {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT payment_id, count(*), min(outcome), max(outcome) FROM ledger GROUP BY payment_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	booked := map[string]string{}
	for rows.Next() {
		var id, lo, hi string
		var n int
		if err := rows.Scan(&id, &n, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("payment %s has %d ledger entries (%s..%s), want exactly 1", id, n, lo, hi)
		}
		booked[id] = lo
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, ids := range []struct {
		list    []string
		outcome string
	}{{good, "settled"}, {declined, "declined"}} {
		for _, id := range ids.list {
			if booked[id] != ids.outcome {
				t.Errorf("payment %s: ledger outcome %q, want %s", id, booked[id], ids.outcome)
			}
			delete(booked, id)
		}
	}
	for id := range booked {
		t.Errorf("payment %s is booked but was never published as a payment", id)
	}
}

// checkDeadLetters: exactly the poison messages are dead-lettered, each
// once, with its reason.
func (e *env) checkDeadLetters(t *testing.T, poison map[string]string) {
	t.Helper()
	got := map[string]int{}
	for _, m := range e.deadLetters(t) {
		reason, id := m.Headers().Get(payment.HeaderReason), m.Headers().Get(payment.HeaderMsgID)
		if want, ok := poison[reason]; !ok || want != id {
			t.Errorf("dead letter %q (id %q, error %q): not one of the poison messages", reason, id, m.Headers().Get(payment.HeaderError))
		}
		got[reason]++
	}
	for reason := range poison {
		if got[reason] != 1 {
			t.Errorf("%d dead letters for %s, want 1", got[reason], reason)
		}
	}
}
