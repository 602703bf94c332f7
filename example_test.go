package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/migrations"
	"github.com/jackc/pgx/v5/pgxpool"
)

// post sends a POST with an Idempotency-Key and prints the answer.
func post(h http.Handler, key, body string) {
	r := httptest.NewRequest("POST", "/api/trading/orders", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.TrimSpace(w.Body.String()))
}

// Wrap an order route fail-closed: the handler runs once per key; a retry
// gets the recorded response, a changed body gets 422.
func Example_orderRoute() {
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		// The user scope: run the idempotency middleware after the session
		// middleware, and return the session's user here.
		Scope: func(ctx context.Context) string { return "42" },
	})
	if err != nil {
		panic(err)
	}
	orders := 0
	placeOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"status":"filled"}`, orders)
	})
	mux := http.NewServeMux()
	// The zero RouteConfig is fail-closed with a 24h TTL.
	mux.Handle("POST /api/trading/orders", mw.MustRoute(idempotency.RouteConfig{})(placeOrder))

	key := "5f0c4a3e-8d2b-4c1a-9e7f-6b5a4c3d2e1f"
	post(mux, key, `{"symbol":"AAPL","side":"buy","qty":10}`)
	post(mux, key, `{"symbol":"AAPL","side":"buy","qty":10}`)
	post(mux, key, `{"symbol":"AAPL","side":"buy","qty":11}`)
	fmt.Println("orders placed:", orders)
	// Output:
	// 201  {"id":1,"status":"filled"}
	// 201 true {"idempotency_replayed":true,"id":1,"status":"filled"}
	// 422  {"error":"idempotency_key_body_mismatch"}
	// orders placed: 1
}

// failingStore is a store whose database is down.
type failingStore struct{ idempotency.Store }

func (failingStore) Claim(context.Context, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{}, &idempotency.StoreError{Op: "claim", Reason: idempotency.ReasonConnection, Err: fmt.Errorf("connection refused")}
}

// Probe reports the database unreachable: the evidence a fail-open route
// needs before it runs a handler without deduplication.
func (failingStore) Probe(context.Context) error {
	return &idempotency.StoreError{Op: "probe", Reason: idempotency.ReasonConnection, Err: fmt.Errorf("connection refused")}
}

// ReleaseOwner finds nothing to free: no claim reached the database.
func (failingStore) ReleaseOwner(context.Context, idempotency.ClaimRequest) (bool, error) {
	return false, nil
}

// Wrap a billing route fail-open: when the store is down the handler still
// runs (without deduplication), while a fail-closed order route answers
// 503 and runs nothing.
func Example_billingRoute() {
	mw, err := idempotency.New(failingStore{}, idempotency.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"cs_1"}`)
	})
	billing := mw.MustRoute(idempotency.RouteConfig{FailOpen: true, TTL: 7 * 24 * time.Hour})(handler)
	orders := mw.MustRoute(idempotency.RouteConfig{})(handler)

	key := "0e1d2c3b-4a59-4687-9a0b-1c2d3e4f5a6b"
	post(billing, key, `{"plan":"pro"}`)
	post(orders, key, `{"plan":"pro"}`)
	// Output:
	// 201  {"id":"cs_1"}
	// 503  {"error":"idempotency_store_unavailable"}
}

// On a transactional route the handler writes through the transaction the
// middleware began: its writes and the key's completed record commit
// together, so a crash never leaves one without the other.
func Example_transactionalRoute() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := migrations.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{})
	if err != nil {
		panic(err)
	}
	placeOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		var id int64
		if err := tx.QueryRow(r.Context(),
			`INSERT INTO paper_orders (symbol, qty) VALUES ('AAPL', 10) RETURNING id`).Scan(&id); err != nil {
			http.Error(w, `{"error":"fill_engine_error"}`, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /api/trading/orders", mw.MustRoute(idempotency.RouteConfig{Transactional: true})(placeOrder))
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

// Accept Stripe-style opaque keys, compared exactly, and answer errors as
// RFC 9457 problem+json. Opaque keys need a user scope (or a minimum key
// length): "all" or "admin" would otherwise reach another client's
// response.
func Example_opaqueKeysProblemJSON() {
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		Scope:           func(ctx context.Context) string { return "42" },
		ErrorFormat:     idempotency.ErrorProblem,
		ProblemTypeBase: "https://api.example.com/problems/",
	})
	if err != nil {
		panic(err)
	}
	charges := 0
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"charge":%d}`, charges)
	})
	h := mw.MustRoute(idempotency.RouteConfig{KeyFormat: idempotency.KeyOpaque, NoReplayMarker: true})(charge)

	post(h, "1733015354123456789_AbC-_x", `{"amount":100}`)
	post(h, "1733015354123456789_AbC-_x", `{"amount":100}`)
	post(h, "1733015354123456789_abc-_x", `{"amount":100}`) // another key: never case-folded
	post(h, "1733015354123456789_AbC-_x", `{"amount":200}`)
	fmt.Println("charges:", charges)
	// Output:
	// 200  {"charge":1}
	// 200 true {"charge":1}
	// 200  {"charge":2}
	// 422  {"type":"https://api.example.com/problems/idempotency_key_body_mismatch","title":"Idempotency-Key was used for another request","status":422,"error":"idempotency_key_body_mismatch"}
	// charges: 2
}

// Consume payment messages with Do, keyed by the message's own id: a
// redelivered message gets the first run's result, never a second payment.
// What the consumer does with the message follows from the error.
func ExampleDo() {
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{})
	if err != nil {
		panic(err)
	}
	settle, err := mw.Operation("settle-payment", idempotency.RouteConfig{Scoped: true}) // every message names its user
	if err != nil {
		panic(err)
	}
	type receipt struct{ Ledger int }
	ledger := 0
	consume := func(msgID, body string) {
		r, info, err := idempotency.Do(context.Background(), settle,
			idempotency.Call{Key: msgID, Scope: "user-42", Request: []byte(body)},
			func(ctx context.Context) (receipt, error) {
				if strings.Contains(body, `"amount":0`) {
					return receipt{}, &idempotency.PermanentError{Code: "invalid_amount", Message: "amount must be positive"}
				}
				ledger++
				return receipt{Ledger: ledger}, nil
			})
		var rejected *idempotency.PermanentError
		switch {
		case err == nil:
			fmt.Println(msgID, "ack, ledger", r.Ledger, "replayed:", info.Replayed)
		case errors.As(err, &rejected):
			fmt.Println(msgID, "ack, rejected:", rejected.Code, "replayed:", info.Replayed)
		case errors.Is(err, idempotency.ErrInFlight), errors.Is(err, idempotency.ErrStoreUnavailable):
			fmt.Println(msgID, "nack, redeliver later")
		default: // ErrMismatch, ErrPreviousFailed, ErrOutcomeUnknown, ...
			fmt.Println(msgID, "dead-letter:", err)
		}
	}
	consume("msg-1", `{"amount":100}`)
	consume("msg-1", `{"amount":100}`) // redelivered
	consume("msg-2", `{"amount":0}`)
	consume("msg-2", `{"amount":0}`)
	consume("msg-1", `{"amount":999}`) // the same id on another payment
	fmt.Println("ledger rows:", ledger)
	// Output:
	// msg-1 ack, ledger 1 replayed: false
	// msg-1 ack, ledger 1 replayed: true
	// msg-2 ack, rejected: invalid_amount replayed: false
	// msg-2 ack, rejected: invalid_amount replayed: true
	// msg-1 dead-letter: idempotency: the key was used for another request (idempotency_key_body_mismatch)
	// ledger rows: 1
}
