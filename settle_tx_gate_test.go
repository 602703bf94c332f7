package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestTxLateCallStaysInItsTransaction: a goroutine of the handler whose
// call on the transaction passed the check that the handler still runs,
// just before the handler returned, reaches the connection inside its own
// request's transaction: closing the handler's view waits for it. It used
// to reach the connection after it went back to the pool, inside the next
// request's transaction, and commit with that one.
func TestTxLateCallStaysInItsTransaction(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{}, testdb.MaxConns(1))
	var armed atomic.Bool
	entered, proceed, closing := make(chan struct{}), make(chan struct{}), make(chan struct{})
	in2, release2 := make(chan struct{}), make(chan struct{})
	late := make(chan error, 1)
	f.behave = func(n int64, _ http.ResponseWriter, r *http.Request) bool {
		if n != 1 {
			close(in2) // the next request, mid-handler
			<-release2
			return false
		}
		tx, _ := idempotency.TxFromContext(r.Context())
		armed.Store(true)
		go func() {
			_, err := tx.Exec(context.Background(), `INSERT INTO orders (idem_key, execution) VALUES ('late', 0)`)
			late <- err
		}()
		<-entered // the late call passed its check: return now
		return false
	}
	ctx := idempotency.WithTxHooksForTest(context.Background(), func() {
		if armed.CompareAndSwap(true, false) {
			close(entered)
			<-proceed
		}
	}, func() { close(closing) })
	first, second := uuid.NewString(), uuid.NewString()
	answers := make(chan string, 2)
	go func() {
		r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`)).WithContext(ctx)
		r.Header.Set(idempotency.HeaderKey, first)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		answers <- answerOf(w)
	}()
	<-entered
	go func() { answers <- answerOf(do(h, second, `{}`)) }()
	// Either the first request's connection went back to the pool and
	// serves the second one (the bug), or closing waits for the late call.
	select {
	case <-in2:
	case <-closing:
	}
	close(proceed)
	if err := <-late; err != nil {
		t.Errorf("the late call, under way before the handler returned: %v", err)
	}
	close(release2)
	for range 2 {
		if a := <-answers; a != "201" {
			t.Errorf("answer %q, want 201", a)
		}
	}
	var lateIn string
	if err := f.pool.QueryRow(context.Background(), `SELECT o.idem_key FROM orders o, orders l
		WHERE l.idem_key = 'late' AND o.idem_key <> 'late' AND o.xmin = l.xmin`).Scan(&lateIn); err != nil {
		t.Fatalf("the late row's transaction: %v", err)
	}
	if lateIn != first {
		t.Fatalf("the late call of the first request committed with the second request's order (%s), want with its own (%s)", lateIn, first)
	}
}
