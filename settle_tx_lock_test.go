package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// messageLocales returns the lc_messages values the test server accepts,
// besides its own: the classification of a lock wait must not depend on
// the language of its message and context.
func messageLocales(t *testing.T) []string {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), testdb.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	locales := []string{""} // the server's
	for _, l := range []string{"ko_KR.UTF-8", "ko_KR.utf8", "de_DE.UTF-8", "de_DE.utf8", "ja_JP.UTF-8"} {
		if _, err := conn.Exec(context.Background(), `SET lc_messages = '`+l+`'`); err == nil {
			locales = append(locales, l)
		}
	}
	if len(locales) == 1 {
		t.Log("the server offers no translated lc_messages (no such locale installed): the server's own only")
	}
	return locales
}

// TestTxLockWaitsToldApartWithoutText: a claim whose lock wait runs out
// on the key's row (its owner is mid-handler) is contention, 409 in
// flight; one whose wait runs out on the table (DDL holds it) is an
// outage, 503, never contention; in every language the server reports
// them in, and under pgx's simple protocol too. Whether the error has a
// context (a row's wait has one) tells them apart, not its text.
func TestTxLockWaitsToldApartWithoutText(t *testing.T) {
	t.Parallel()
	for _, loc := range messageLocales(t) {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
			t.Run(loc+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				f, h := newTxFixture(t, idempotency.Config{StoreTimeout: 2 * time.Second, Lease: 10 * time.Second}, idempotency.RouteConfig{},
					testdb.MaxConns(2), testdb.Configure(func(c *pgxpool.Config) {
						c.ConnConfig.DefaultQueryExecMode = mode
						if loc != "" {
							c.ConnConfig.RuntimeParams["lc_messages"] = loc
						}
					}))
				// Both connections have served a claim: their statements
				// are prepared, so a claim meets a lock under its bound.
				holdAll(t, f, h, 2)
				f.calls.Store(0)
				in, release := blockedOwner(f, 0)
				key := uuid.NewString()
				owner := make(chan *httptest.ResponseRecorder)
				go func() { owner <- do(h, key, `{}`) }()
				<-in
				if a := answerOf(do(h, key, `{}`)); a != "409 idempotency_in_flight" {
					t.Errorf("a duplicate while its owner is mid-handler: %q, want 409 in flight", a)
				}
				close(release)
				if a := answerOf(<-owner); a != "201" {
					t.Fatalf("owner: %q", a)
				}
				locker, err := pgx.ConnectConfig(t.Context(), f.pool.Config().ConnConfig)
				if err != nil {
					t.Fatal(err)
				}
				defer locker.Close(context.Background())
				tx, err := locker.Begin(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback(context.Background()) }()
				if _, err := tx.Exec(t.Context(), `ALTER TABLE idempotency_keys ADD COLUMN probe INT`); err != nil {
					t.Fatal(err)
				}
				if a := answerOf(do(h, uuid.NewString(), `{}`)); a != "503 idempotency_store_unavailable" {
					t.Errorf("a claim behind a migration's lock: %q, want 503", a)
				}
				if errs := storeErrors(t, f.reg, "begin"); len(errs) != 1 || errs[idempotency.ReasonConflict] != 0 {
					t.Errorf("begin store errors %v, want one, an outage's", errs)
				}
				if n := gathered(t, f.reg, "idempotency_conflicts_total", "orders", "in_flight"); n != 1 {
					t.Errorf("in_flight conflicts = %v, want 1 (the duplicate's only)", n)
				}
				if f.calls.Load() != 1 {
					t.Errorf("executions %d, want 1 (the owner)", f.calls.Load())
				}
			})
		}
	}
}

// storeErrors returns idempotency_store_errors_total of operation op by
// reason.
func storeErrors(t *testing.T, reg prometheus.Gatherer, op string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "idempotency_store_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["operation"] == op {
				out[labels["reason"]] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// setLocalAlone is a batch tracer that fails the test for a batch that
// holds a SET LOCAL beside another statement.
type setLocalAlone struct {
	t       *testing.T
	batches atomic.Int64
}

func (s *setLocalAlone) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (s *setLocalAlone) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *setLocalAlone) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	s.batches.Add(1)
	for _, q := range d.Batch.QueuedQueries {
		if strings.HasPrefix(q.SQL, "SET LOCAL") && d.Batch.Len() > 1 {
			s.t.Errorf("a SET LOCAL shares its query with others: %q", sqlOf(d.Batch))
		}
	}
	return ctx
}
func (s *setLocalAlone) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (s *setLocalAlone) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func sqlOf(b *pgx.Batch) []string {
	var out []string
	for _, q := range b.QueuedQueries {
		out = append(out, q.SQL)
	}
	return out
}

// TestTxSimpleProtocolSetLocalAlone: under pgx's simple protocol, which
// sends a batch as one multi-statement string (and Citus forwards such a
// string whole), no SET LOCAL of a transactional route shares a query:
// a claim, a duplicate mid-handler, a takeover, a failed key and a record
// after a handler's SET LOCAL ROLE.
func TestTxSimpleProtocolSetLocalAlone(t *testing.T) {
	t.Parallel()
	tracer := &setLocalAlone{t: t}
	f, h := newTxFixture(t, idempotency.Config{StoreTimeout: 2 * time.Second, Lease: 10 * time.Second}, idempotency.RouteConfig{},
		testdb.MaxConns(2), testdb.Configure(func(c *pgxpool.Config) {
			c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			c.ConnConfig.Tracer = tracer
		}))
	role := newRole(t, f.pool, `GRANT USAGE ON SCHEMA `+schemaOf(f.pool)+` TO %s`, `GRANT INSERT ON orders TO %s`)
	key := uuid.NewString()
	in, release := blockedOwner(f, 0)
	owner := make(chan string)
	go func() { owner <- answerOf(do(h, key, `{}`)) }()
	<-in
	if a := answerOf(do(h, key, `{}`)); a != "409 idempotency_in_flight" {
		t.Errorf("duplicate mid-handler: %q", a)
	}
	close(release)
	if a := <-owner; a != "201" {
		t.Fatalf("owner: %q", a)
	}
	if _, err := f.pool.Exec(context.Background(), `UPDATE idempotency_keys SET expires_at = now() - interval '1 second', retain_until = now() - interval '1 second' WHERE idem_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	handlerRuns(t, f, `SET LOCAL ROLE `+role)
	if a := answerOf(do(h, key, `{}`)); a != "201" {
		t.Errorf("takeover of the expired key, the handler's role set: %q, want 201", a)
	}
	f.behave = func(_ int64, w http.ResponseWriter, _ *http.Request) bool {
		w.WriteHeader(http.StatusInternalServerError)
		return true
	}
	failing := uuid.NewString()
	if a, b := answerOf(do(h, failing, `{}`)), answerOf(do(h, failing, `{}`)); a != "500" || b != "409 idempotency_previous_failed" {
		t.Errorf("a failing handler: %q then %q", a, b)
	}
	if tracer.batches.Load() == 0 {
		t.Fatal("no batch traced")
	}
}
