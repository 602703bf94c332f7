package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
)

// A transactional answer follows its commit (DESIGN-settled-r4.md item 2):
// when the route's transaction ended under the handler, the client gets
// 503 idempotency_store_unavailable with Retry-After: 1, never the
// handler's answer, and an ERROR is logged. The row decides the retry:
// nothing committed, the key is free and the retry executes; the claim
// committed (the handler's own COMMIT), the lease is ended and the retry
// answers 409 idempotency_outcome_unknown, never a second execution.

// leaseEnded reports whether key's row is in_flight with its lease over
// (locked_until <= now()), as the engine leaves a claim the handler
// committed; ok is false when the key has no row.
func (f *txFixture) leaseEnded(t *testing.T, key string) (ended, ok bool) {
	t.Helper()
	err := f.pool.QueryRow(context.Background(),
		`SELECT status = 'in_flight' AND locked_until <= now() FROM idempotency_keys WHERE idem_key = $1`, key).Scan(&ended)
	if err != nil && !strings.Contains(err.Error(), "no rows") {
		t.Fatal(err)
	}
	return ended, err == nil
}

// TestTxHandlerEndsTransaction: a handler that ends the route's
// transaction itself with SQL never has its answer delivered. After a
// COMMIT (whatever it answers, a panic included) its writes stay, exactly
// once, and the retry answers 409 outcome_unknown with the lease ended;
// after a ROLLBACK the key is free and the retry executes, once.
func TestTxHandlerEndsTransaction(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		sql        string
		rc         idempotency.RouteConfig
		status     int // the handler's answer; 0 panics
		wantRetry  int
		wantOrders int
		wantCalls  int64
	}{
		{"COMMIT then 201", "COMMIT", idempotency.RouteConfig{}, 201, 409, 1, 1},
		{"ROLLBACK then 201", "ROLLBACK", idempotency.RouteConfig{}, 201, 201, 1, 2},
		{"COMMIT then 500 under ReleaseOnError", "COMMIT", idempotency.RouteConfig{ReleaseOnError: true}, 500, 409, 1, 1},
		{"COMMIT then 429", "COMMIT", idempotency.RouteConfig{}, 429, 409, 1, 1},
		{"COMMIT then panic under ReleaseOnError", "COMMIT", idempotency.RouteConfig{ReleaseOnError: true}, 0, 409, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			logs := &logBuffer{}
			f, h := newTxFixture(t, idempotency.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, c.rc)
			f.behave = func(n int64, w http.ResponseWriter, r *http.Request) bool {
				if n > 1 {
					return false // the retry, when it executes: an ordinary 201
				}
				tx, _ := idempotency.TxFromContext(r.Context())
				if _, err := tx.Exec(r.Context(), c.sql); err != nil {
					t.Errorf("%s: %v", c.sql, err)
				}
				if c.status == 0 {
					panic("after " + c.sql)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(c.status)
				fmt.Fprint(w, `{"done":true}`)
				return true
			}
			key := uuid.NewString()
			if c.status == 0 {
				func() {
					defer func() { _ = recover() }()
					do(h, key, `{}`)
				}()
			} else {
				wantUnavailable(t, "first", do(h, key, `{}`))
			}
			if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "transaction ended under the handler") {
				t.Errorf("no ERROR naming the cause; logs:\n%s", logs)
			}
			if ended, ok := f.leaseEnded(t, key); c.sql == "COMMIT" && !ended || c.sql == "ROLLBACK" && ok {
				t.Errorf("after %s: lease ended %v, row %v; want the committed claim's lease ended, or no row", c.sql, ended, ok)
			}
			w := do(h, key, `{}`)
			if w.Code != c.wantRetry || c.wantRetry == 409 && !strings.Contains(w.Body.String(), "idempotency_outcome_unknown") {
				t.Fatalf("retry: %d %s, want %d", w.Code, w.Body, c.wantRetry)
			}
			if f.calls.Load() != c.wantCalls || f.orders(t) != c.wantOrders {
				t.Fatalf("executions %d, orders %d; want %d and %d", f.calls.Load(), f.orders(t), c.wantCalls, c.wantOrders)
			}
		})
	}
}

// TestDoTransactionEndedUnderFunction: Do's function that commits the
// lent transaction itself gets an error that is ErrStoreUnavailable (and
// ErrTxEnded, the cause), never its own result; its write stays once and the retry gets outcome_unknown.
func TestDoTransactionEndedUnderFunction(t *testing.T) {
	t.Parallel()
	op, pool := ledgerOp(t, idempotency.Config{Logger: quiet}, idempotency.RouteConfig{})
	key := uuid.NewString()
	calls := 0
	fn := func(ctx context.Context) (receipt, error) {
		calls++
		id, err := book(ctx)
		if err != nil {
			return receipt{}, err
		}
		tx, _ := idempotency.TxFromContext(ctx)
		if _, err := tx.Exec(ctx, "COMMIT"); err != nil {
			return receipt{}, err
		}
		return receipt{Ledger: id}, nil
	}
	if r, _, err := idempotency.Do(t.Context(), op, payment(key), fn); !errors.Is(err, idempotency.ErrStoreUnavailable) || !errors.Is(err, idempotency.ErrTxEnded) {
		t.Fatalf("first: %+v %v; want ErrStoreUnavailable and ErrTxEnded", r, err)
	}
	_, _, err := idempotency.Do(t.Context(), op, payment(key), fn)
	wantAnswer(t, "retry", err, idempotency.ErrOutcomeUnknown, 409)
	if calls != 1 || ledgerRows(t, pool, key) != 1 {
		t.Fatalf("calls %d, ledger rows %d; want 1 and 1", calls, ledgerRows(t, pool, key))
	}
}

// TestTxCommitThenConnectionLost: a handler that ran COMMIT and whose
// connection then closed left a committed claim behind: the engine still
// ends its lease (the gate saw the end before the connection went), so the
// retry answers 409 outcome_unknown at once, not in_flight for the lease.
func TestTxCommitThenConnectionLost(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	f.behave = func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		tx, _ := idempotency.TxFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `COMMIT`); err != nil {
			t.Error(err)
		}
		if err := tx.Conn().Close(r.Context()); err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusCreated)
		return true
	}
	key := uuid.NewString()
	wantUnavailable(t, "first", do(h, key, `{}`))
	if w := do(h, key, `{}`); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_outcome_unknown") {
		t.Fatalf("retry: %d %s, want 409 idempotency_outcome_unknown", w.Code, w.Body)
	}
	if f.calls.Load() != 1 || f.orders(t) != 1 {
		t.Fatalf("executions %d, orders %d; want 1 and 1", f.calls.Load(), f.orders(t))
	}
}

// TestTxHandlerLosesDeadlock: a class-40 error (a deadlock, a
// serialization failure) inside the lent transaction ends it on every
// store (DESIGN-settled-r4.md items 2 and 3; sqlstore does the same): the
// handler's work is lost, so its answer must not be recorded, whatever it
// answers after catching the error. Its later calls are refused with
// ErrTxEnded, the client gets 503, nothing of the first run commits, and
// the retry executes once. The error comes from PL/pgSQL's RAISE with the
// deadlock's SQLSTATE, through Exec and through Query's rows alike.
func TestTxHandlerLosesDeadlock(t *testing.T) {
	t.Parallel()
	const raise = `DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$`
	for _, via := range []string{"Exec", "Query"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			f, h := newTxFixture(t, idempotency.Config{Logger: quiet}, idempotency.RouteConfig{})
			var after error
			f.behave = func(n int64, w http.ResponseWriter, r *http.Request) bool {
				if n > 1 {
					return false // the retry: an ordinary 201
				}
				tx, _ := idempotency.TxFromContext(r.Context())
				var err error
				if via == "Exec" {
					_, err = tx.Exec(r.Context(), raise)
				} else {
					rows, qerr := tx.Query(r.Context(), raise)
					if err = qerr; err == nil {
						rows.Close()
						err = rows.Err()
					}
				}
				if err == nil {
					t.Errorf("%s: the raised deadlock came back as no error", via)
				}
				// A handler that retries its statements after the deadlock.
				_, after = tx.Exec(r.Context(), `INSERT INTO orders (idem_key, execution) VALUES ('after', 0)`)
				w.WriteHeader(201)
				return true
			}
			key := uuid.NewString()
			wantUnavailable(t, "first", do(h, key, `{}`))
			if !errors.Is(after, idempotency.ErrTxEnded) {
				t.Errorf("the handler's statement after the deadlock: %v, want ErrTxEnded", after)
			}
			if n := f.orders(t); n != 0 {
				t.Fatalf("%d orders committed by the run that lost its deadlock, want 0", n)
			}
			if w := do(h, key, `{}`); w.Code != 201 {
				t.Fatalf("retry: %d %s, want 201", w.Code, w.Body)
			}
			if f.calls.Load() != 2 || f.orders(t) != 1 {
				t.Fatalf("executions %d, orders %d; want 2 and 1", f.calls.Load(), f.orders(t))
			}
		})
	}
}
