package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestExpiresHeaderOnTransactionalRoutes: a transactional route's original
// and replay carry the row's expires_at (the claim's, committed with the
// record), rounded down to the second; a duplicate that waited past the
// lock wait on the owner's uncommitted row saw no row, and its 409 in
// flight carries none.
func TestExpiresHeaderOnTransactionalRoutes(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	mw := newMiddleware(t, idempotency.NewPostgresStore(pool), idempotency.Config{StoreTimeout: 5 * time.Second})
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: true, TxLockWait: 200 * time.Millisecond})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Hold") != "" {
				entered <- struct{}{}
				<-release
			}
			w.WriteHeader(http.StatusCreated)
		}))
	send := func(key string, hold bool) *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/orders", strings.NewReader(`{}`))
		r.Header.Set(idempotency.HeaderKey, key)
		if hold {
			r.Header.Set("X-Hold", "1")
		}
		return serveWithin(h, r, doBound)
	}
	stored := func(key string) string {
		var at time.Time
		if err := pool.QueryRow(t.Context(), "SELECT expires_at FROM idempotency_keys WHERE idem_key = $1", key).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at.UTC().Truncate(time.Second).Format(http.TimeFormat)
	}

	key := uuid.NewString()
	first := send(key, false)
	want := stored(key)
	if first.Code != 201 || first.Header().Get(idempotency.HeaderExpires) != want {
		t.Fatalf("original: %d, Idempotency-Expires %q, want 201 and %q", first.Code, first.Header().Get(idempotency.HeaderExpires), want)
	}
	if again := send(key, false); again.Code != 201 || again.Header().Get(idempotency.HeaderReplayed) != "true" ||
		again.Header().Get(idempotency.HeaderExpires) != want {
		t.Fatalf("replay: %d, Idempotency-Expires %q, want 201 replayed and %q", again.Code, again.Header().Get(idempotency.HeaderExpires), want)
	}

	held := uuid.NewString()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- send(held, true) }()
	<-entered
	dup := send(held, false)
	close(release)
	if dup.Code != 409 || !strings.Contains(dup.Body.String(), "idempotency_in_flight") || dup.Header().Get(idempotency.HeaderExpires) != "" {
		t.Fatalf("transactional duplicate: %d %s, Idempotency-Expires %q, want 409 in flight without it", dup.Code, dup.Body, dup.Header().Get(idempotency.HeaderExpires))
	}
	if w := <-done; w.Code != 201 || w.Header().Get(idempotency.HeaderExpires) != stored(held) {
		t.Fatalf("held original: %d, Idempotency-Expires %q", w.Code, w.Header().Get(idempotency.HeaderExpires))
	}
}
