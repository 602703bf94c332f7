package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/examples/consumer/payment"
	"github.com/idemkit/idempotency/internal/testdb"
)

// The broker tests run the consumer as processes of its own against the
// real NATS JetStream and PostgreSQL: IDEMPOTENCY_TEST_NATS_URL and
// IDEMPOTENCY_TEST_DATABASE_URL. Without them they skip with one line;
// IDEMPOTENCY_REQUIRE_BROKER=1 and IDEMPOTENCY_REQUIRE_DB=1 (CI) turn that
// skip into a failure. Each test gets its own streams and schema, so
// parallel runs never share.

// bin holds the binaries built once per test run.
var bin struct {
	once     sync.Once
	dir      string
	consumer string
	publish  string
	err      error
}

// TestMain removes the built binaries and fails a run that leaves
// goroutines behind (goleak).
func TestMain(m *testing.M) {
	code := m.Run()
	if bin.dir != "" {
		os.RemoveAll(bin.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// build builds the consumer and the publisher, with the race detector when
// the tests have it.
func build(t *testing.T) {
	t.Helper()
	bin.once.Do(func() {
		bin.dir, bin.err = os.MkdirTemp("", "consumer-test-")
		if bin.err != nil {
			return
		}
		bin.consumer, bin.publish = filepath.Join(bin.dir, "consumer"), filepath.Join(bin.dir, "publish")
		for out, pkg := range map[string]string{bin.consumer: ".", bin.publish: "./publish"} {
			args := []string{"build", "-o", out}
			if raceEnabled {
				args = append(args, "-race")
			}
			if b, err := exec.Command("go", append(args, pkg)...).CombinedOutput(); err != nil {
				bin.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
				return
			}
		}
	})
	if bin.err != nil {
		t.Fatal(bin.err)
	}
}

// env is one test's broker and database.
type env struct {
	natsURL string
	dbURL   string // the test's schema first on the search_path
	js      jetstream.JetStream
	pool    *pgxpool.Pool // on the test's schema
	streams payment.Streams
	schema  string
}

// service returns the URL in the environment variable, or skips (fails
// under require).
func service(t *testing.T, variable, require, what string) string {
	t.Helper()
	u := os.Getenv(variable)
	if u == "" {
		if os.Getenv(require) == "1" {
			t.Fatalf("%s is not set and %s=1: %s is required", variable, require, what)
		}
		testdb.Skip(t, "no "+what+": set "+variable, fmt.Sprintf("set %s to run the consumer against %s", variable, what))
	}
	return u
}

// newEnv gives the test fresh streams and a fresh schema, dropped after it.
func newEnv(t *testing.T) *env {
	t.Helper()
	natsURL := service(t, "IDEMPOTENCY_TEST_NATS_URL", "IDEMPOTENCY_REQUIRE_BROKER", "NATS JetStream (nats://127.0.0.1:4222)")
	dbURL := service(t, "IDEMPOTENCY_TEST_DATABASE_URL", "IDEMPOTENCY_REQUIRE_DB", "PostgreSQL")
	build(t)
	suffix := randomHex(t)
	e := &env{natsURL: natsURL, streams: payment.Streams{Name: "IDEM_TEST_" + strings.ToUpper(suffix)}, schema: "idem_test_consumer_" + suffix}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+e.schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropSchema(t, dbURL, e.schema) })
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", e.schema)
	u.RawQuery = q.Encode()
	e.dbURL = u.String()
	if e.pool, err = pgxpool.New(ctx, e.dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)

	nc, js, err := payment.Connect(natsURL, "examples/consumer tests")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e.js = js
	if err := e.streams.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{e.streams.Name, e.streams.DeadStream()} {
			if err := js.DeleteStream(ctx, s); err != nil {
				t.Errorf("delete stream %s: %v", s, err)
			}
		}
	})
	return e
}

func dropSchema(t *testing.T, dbURL, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dbURL)
	if err == nil {
		_, err = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		c.Close(ctx)
	}
	if err != nil {
		t.Errorf("drop schema %s: %v", schema, err)
	}
}

func randomHex(t *testing.T) string {
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// flags are the consumer's flags for this test: short ack wait and nack
// delays, so redeliveries come within seconds. dbURL, if given, replaces
// the database (a proxy's address).
func (e *env) flags(name string, extra ...string) []string {
	u, _ := url.Parse(e.dbURL)
	q := u.Query()
	q.Set("application_name", e.schema+"-"+name) // to find its sessions in pg_stat_activity
	u.RawQuery = q.Encode()
	return append([]string{"-nats", e.natsURL, "-database", u.String(), "-stream", e.streams.Name,
		"-ack-wait", "1s", "-max-nak-delay", "200ms"}, extra...)
}

// publish publishes p, failing the test if JetStream drops it.
func (e *env) publish(t *testing.T, p payment.Payment) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dup, err := e.streams.Publish(ctx, e.js, p)
	if err != nil || dup {
		t.Fatalf("publish %s: duplicate %v, %v", p.ID, dup, err)
	}
}

// ledgerRows counts payment id's ledger entries.
func (e *env) ledgerRows(t *testing.T, id string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger WHERE payment_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// drained reports whether the durable consumer holds nothing now.
func (e *env) drained(t *testing.T) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := e.consumerInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0
}

// settled waits until the durable consumer holds nothing: every message
// delivered and acked or terminated, none pending a redelivery.
func (e *env) settled(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := e.consumerInfo(ctx)
		cancel()
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the consumer still holds messages after a minute: %+v %v", info, err)
		}
		time.Sleep(50 * time.Millisecond) // broker state, seen from another process: polled
	}
}

func (e *env) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	c, err := e.js.Consumer(ctx, e.streams.Name, payment.Durable)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// deadLetters reads the whole dead-letter stream.
func (e *env) deadLetters(t *testing.T) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, e.streams.DeadStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	if info.State.Msgs == 0 {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(int(info.State.Msgs), jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if uint64(len(msgs)) != info.State.Msgs {
		t.Fatalf("read %d dead letters of %d", len(msgs), info.State.Msgs)
	}
	return msgs
}

// inLedgerWrite reports whether the consumer named name has a session
// inside a transaction whose last statement was the ledger's INSERT.
func (e *env) inLedgerWrite(t *testing.T, name string) bool {
	t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND state = 'idle in transaction' AND query LIKE 'INSERT INTO ledger%'`,
		e.schema+"-"+name).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}
