package sqlstore_test

import (
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// expiresStore is one store under the Idempotency-Expires test, with a
// way to read a key's expires_at from its row, past the store's own codec.
type expiresStore struct {
	name  string
	store func(t *testing.T) (idempotency.Store, func(t *testing.T, key string) time.Time)
}

// expiresStores are the memory store, the pgx store, and sqlstore's two
// dialects.
var expiresStores = []expiresStore{
	{name: "memory", store: func(t *testing.T) (idempotency.Store, func(*testing.T, string) time.Time) {
		s := idempotency.NewMemoryStore()
		return s, func(t *testing.T, key string) time.Time {
			recs, err := s.ExportScope(t.Context(), "")
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if r.Key == key {
					return r.ExpiresAt
				}
			}
			t.Fatalf("no row for %s", key)
			return time.Time{}
		}
	}},
	{name: "pgx", store: func(t *testing.T) (idempotency.Store, func(*testing.T, string) time.Time) {
		pool := testdb.New(t)
		return idempotency.NewPostgresStore(pool), func(t *testing.T, key string) time.Time {
			var at time.Time
			if err := pool.QueryRow(t.Context(), "SELECT expires_at FROM idempotency_keys WHERE idem_key = $1", key).Scan(&at); err != nil {
				t.Fatal(err)
			}
			return at
		}
	}},
	{name: "sql-postgres", store: func(t *testing.T) (idempotency.Store, func(*testing.T, string) time.Time) {
		db, _ := pgDB(t, "pgx", 8)
		return pgStore(t, db), sqlExpires(db, "$1")
	}},
	{name: "sql-mysql", store: func(t *testing.T) (idempotency.Store, func(*testing.T, string) time.Time) {
		d := newMySQLDB(t)
		return d.store(t, 8), sqlExpires(d.open(t, 2), "?")
	}},
}

// sqlExpires reads a key's expires_at on db, whose placeholder is ph.
func sqlExpires(db *sql.DB, ph string) func(*testing.T, string) time.Time {
	return func(t *testing.T, key string) time.Time {
		var at time.Time
		if err := db.QueryRowContext(t.Context(), "SELECT expires_at FROM idempotency_keys WHERE idem_key = "+ph, key).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
}

// TestExpiresHeaderIsTheRowsExpiry: every answer that read or wrote a
// committed row (the original, its replay, 409 failed, in flight, outcome
// unknown and not stored, 422 mismatch) carries Idempotency-Expires, the
// row's expires_at as stored, rounded down to the second; 400 and 413,
// which read no row, carry none. On every store.
func TestExpiresHeaderIsTheRowsExpiry(t *testing.T) {
	t.Parallel()
	for _, es := range expiresStores {
		t.Run(es.name, func(t *testing.T) {
			t.Parallel()
			store, expiresAt := es.store(t)
			release := make(chan struct{})
			started := make(chan struct{}, 4)
			mw := newMiddleware(t, store, idempotency.Config{Lease: 1500 * time.Millisecond, StoreTimeout: 500 * time.Millisecond})
			rt := mw.MustRoute(idempotency.RouteConfig{Name: "orders", MaxBodyBytes: 64, MaxResponseBytes: 32})
			var calls atomic.Int64
			h := rt(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				body, _ := io.ReadAll(r.Body)
				switch string(body) {
				case "fail":
					w.WriteHeader(http.StatusInternalServerError)
				case "big":
					_, _ = io.WriteString(w, strings.Repeat("x", 64))
				case "hold":
					started <- struct{}{}
					<-release // past the lease: a duplicate then finds it stale
					w.WriteHeader(http.StatusCreated)
				default:
					w.WriteHeader(http.StatusCreated)
				}
			}))
			send := func(key, body string) *httptest.ResponseRecorder {
				r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/orders", strings.NewReader(body))
				r.Header.Set(idempotency.HeaderKey, key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			want := func(what string, w *httptest.ResponseRecorder, status int, key string) {
				t.Helper()
				if w.Code != status {
					t.Fatalf("%s: status %d, want %d: %s", what, w.Code, status, w.Body)
				}
				at := expiresAt(t, key)
				if got, exp := w.Header().Get(idempotency.HeaderExpires), at.UTC().Truncate(time.Second).Format(http.TimeFormat); got != exp {
					t.Fatalf("%s: Idempotency-Expires %q, want %q (expires_at %v)", what, got, exp, at)
				}
			}
			none := func(what string, w *httptest.ResponseRecorder, status int) {
				t.Helper()
				if w.Code != status || w.Header().Get(idempotency.HeaderExpires) != "" {
					t.Fatalf("%s: status %d (want %d), Idempotency-Expires %q (want none)", what, w.Code, status, w.Header().Get(idempotency.HeaderExpires))
				}
			}

			k := uuid.NewString()
			want("original", send(k, "ok"), 201, k)
			want("replay", send(k, "ok"), 201, k)
			want("422 mismatch", send(k, "other"), 422, k)
			failed := uuid.NewString()
			want("failed original", send(failed, "fail"), 500, failed)
			want("409 failed", send(failed, "fail"), 409, failed)
			big := uuid.NewString()
			want("original not stored", send(big, "big"), 200, big)
			want("409 not stored", send(big, "big"), 409, big)
			none("400", send("not-a-key", "ok"), 400)
			none("413", send(uuid.NewString(), strings.Repeat("x", 65)), 413)

			held := uuid.NewString()
			done := make(chan *httptest.ResponseRecorder, 1)
			go func() { done <- send(held, "hold") }()
			<-started
			want("409 in flight", send(held, "hold"), 409, held)
			// The lease (1.5 s) runs out while the handler holds on: its
			// duplicates turn from in flight to outcome unknown.
			deadline := time.Now().Add(30 * time.Second)
			for {
				w := send(held, "hold")
				if code := w.Body.String(); strings.Contains(code, "idempotency_outcome_unknown") {
					want("409 outcome unknown", w, 409, held)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no outcome unknown 30 s after the lease: %d %s", w.Code, w.Body)
				}
				time.Sleep(50 * time.Millisecond) // the lease's end, on the store's clock
			}
			close(release)
			<-done
			if n := calls.Load(); n != 4 {
				t.Fatalf("the handler ran %d times, want 4 (one per key)", n)
			}
		})
	}
}
