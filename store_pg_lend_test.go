package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// The lent transaction runs each call as exactly one statement, and
// refuses every call once the transaction ended (DESIGN-settled-r4.md
// item 2): no statement of the handler ever runs outside the transaction
// that holds its key.

// escaped counts the orders a handler tried to write after ending the
// transaction (idem_key 'escaped').
func (f *txFixture) escaped(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE idem_key = 'escaped'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// modes are the pool's default query modes a lent transaction is tested
// under: pgx's default, and the simple protocol (PgBouncer setups), under
// which pgx would send a call's string as it is.
var modes = []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol}

// TestTxLentCallIsOneStatement: a string of several statements, ROLLBACK
// then a write, is refused (42601) whichever way it is sent, so the write
// never runs in autocommit; the handler's answer to the error stands (its
// transaction is aborted: rolled back to the savepoint, recorded failed).
func TestTxLentCallIsOneStatement(t *testing.T) {
	t.Parallel()
	const multi = `ROLLBACK; INSERT INTO orders (idem_key, execution) VALUES ('escaped', 0)`
	calls := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"Exec": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, multi)
			return err
		},
		"Exec with an argument": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `ROLLBACK; INSERT INTO orders (idem_key, execution) VALUES ($1, 0)`, "escaped")
			return err
		},
		"Exec in the simple protocol": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, multi, pgx.QueryExecModeSimpleProtocol)
			return err
		},
		"Exec with named arguments": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, multi, pgx.NamedArgs{})
			return err
		},
		"Query": func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, multi, pgx.QueryExecModeSimpleProtocol)
			if err == nil {
				rows.Close()
				err = rows.Err()
			}
			return err
		},
	}
	for _, mode := range modes {
		for name, call := range calls {
			t.Run(fmt.Sprintf("%v/%s", mode, name), func(t *testing.T) {
				t.Parallel()
				f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{},
					testdb.Configure(func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode }))
				f.behave = func(_ int64, w http.ResponseWriter, r *http.Request) bool {
					tx, _ := idempotency.TxFromContext(r.Context())
					err := call(r.Context(), tx)
					if err == nil {
						t.Error("several statements in one call ran")
					}
					http.Error(w, fmt.Sprint(err), http.StatusInternalServerError)
					return true
				}
				key := uuid.NewString()
				if a := answerOf(do(h, key, `{}`)); a != "500" {
					t.Errorf("answer %q, want the handler's 500", a)
				}
				if n := f.escaped(t); n != 0 || f.orders(t) != 0 {
					t.Fatalf("%d escaped orders, %d in all: the write after ROLLBACK ran in autocommit", n, f.orders(t))
				}
				if a := answerOf(do(h, key, `{}`)); a != "409 idempotency_previous_failed" || f.calls.Load() != 1 {
					t.Fatalf("retry: %q after %d executions, want 409 previous_failed after 1", a, f.calls.Load())
				}
			})
		}
	}
}

// TestTxLentCallAfterCommit: after a handler's own COMMIT (its order
// committed) every further call of the lent transaction returns
// ErrTxEnded and sends nothing: the next write is not in the table. The
// answer is 503, the committed order exists exactly once, the claim's
// lease is ended, and the retry answers 409 outcome_unknown, never
// running the handler again.
func TestTxLentCallAfterCommit(t *testing.T) {
	t.Parallel()
	const write = `INSERT INTO orders (idem_key, execution) VALUES ('escaped', 0)`
	after := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"Exec": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, write)
			return err
		},
		"Exec with an argument": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO orders (idem_key, execution) VALUES ($1, 0)`, "escaped")
			return err
		},
		"QueryRow": func(ctx context.Context, tx pgx.Tx) error {
			var id int64
			return tx.QueryRow(ctx, write+` RETURNING id`).Scan(&id)
		},
		"SendBatch": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(write)
			return tx.SendBatch(ctx, b).Close()
		},
		"CopyFrom": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"idem_key", "execution"}, pgx.CopyFromRows([][]any{{"escaped", 0}}))
			return err
		},
		"a savepoint": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Begin(ctx)
			return err
		},
	}
	ends := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"Exec": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `COMMIT`)
			return err
		},
		// pgx would send the batch as one pipeline: the write after COMMIT
		// would commit on its own.
		"a batch": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(`COMMIT`)
			b.Queue(write)
			err := tx.SendBatch(ctx, b).Close()
			if !errors.Is(err, idempotency.ErrTxEnded) {
				return fmt.Errorf("the batch's write after its COMMIT: %v, want ErrTxEnded", err)
			}
			return nil
		},
	}
	for _, mode := range modes {
		for endName, end := range ends {
			for name, call := range after {
				t.Run(fmt.Sprintf("%v/COMMIT by %s/%s", mode, endName, name), func(t *testing.T) {
					t.Parallel()
					f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{},
						testdb.Configure(func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode }))
					f.behave = func(_ int64, w http.ResponseWriter, r *http.Request) bool {
						tx, _ := idempotency.TxFromContext(r.Context())
						if err := end(r.Context(), tx); err != nil {
							t.Errorf("COMMIT: %v", err)
						}
						if err := call(r.Context(), tx); !errors.Is(err, idempotency.ErrTxEnded) {
							t.Errorf("%s after COMMIT: %v, want ErrTxEnded", name, err)
						}
						w.WriteHeader(http.StatusCreated)
						return true
					}
					key := uuid.NewString()
					if a := answerOf(do(h, key, `{}`)); a != "503 idempotency_store_unavailable" {
						t.Errorf("answer %q, want 503 idempotency_store_unavailable", a)
					}
					if f.escaped(t) != 0 || f.orders(t) != 1 {
						t.Fatalf("%d escaped orders, %d in all; want none escaped and the committed order once", f.escaped(t), f.orders(t))
					}
					if ended, _ := f.leaseEnded(t, key); !ended {
						t.Error("the committed claim's lease was not ended (locked_until <= now())")
					}
					if w := do(h, key, `{}`); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_outcome_unknown") {
						t.Fatalf("retry: %d %s, want 409 idempotency_outcome_unknown", w.Code, w.Body)
					}
					if f.calls.Load() != 1 || f.orders(t) != 1 {
						t.Fatalf("executions %d, orders %d; want 1 and 1", f.calls.Load(), f.orders(t))
					}
				})
			}
		}
	}
}

// TestTxLentExecWithoutArguments: an Exec without arguments still runs a
// statement the handler prepared by its name, and an ordinary statement,
// in the route's transaction: both writes commit with the record, once.
func TestTxLentExecWithoutArguments(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			t.Parallel()
			f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{},
				testdb.Configure(func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode }))
			f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
				tx, _ := idempotency.TxFromContext(r.Context())
				if _, err := tx.Prepare(r.Context(), "book", `INSERT INTO orders (idem_key, execution) VALUES ('prepared', 0)`); err != nil {
					t.Error(err)
				}
				for _, sql := range []string{"book", `INSERT INTO orders (idem_key, execution) VALUES ('plain', 0)`} {
					if tag, err := tx.Exec(r.Context(), sql); err != nil || tag.RowsAffected() != 1 {
						t.Errorf("%s: %v %v", sql, tag, err)
					}
				}
				return false
			}
			key := uuid.NewString()
			for range 2 {
				if w := do(h, key, `{}`); w.Code != http.StatusCreated {
					t.Fatalf("%d %s", w.Code, w.Body)
				}
			}
			if f.calls.Load() != 1 || f.orders(t) != 3 {
				t.Fatalf("executions %d, orders %d; want 1 and 3", f.calls.Load(), f.orders(t))
			}
		})
	}
}
