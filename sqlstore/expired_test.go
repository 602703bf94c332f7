package sqlstore_test

import (
	"database/sql"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
)

// TestExpiredRefuseRoute: on both dialects, ordinary and transactional
// routes alike, a key past its TTL under ExpiredRefuse answers 422
// idempotency_key_expired to the same body and another, running nothing;
// cleanup purges its response and keeps the row until the grace ends, then
// deletes it, and the key runs again. Time passes by moving the row's
// times back (age).
func TestExpiredRefuseRoute(t *testing.T) {
	t.Parallel()
	type dialect struct {
		name  string
		store func(t *testing.T) (idempotency.Store, *sql.DB, string)
		age   string // moves every time of the row back by one hour and a minute
	}
	dialects := []dialect{
		{"PostgreSQL", func(t *testing.T) (idempotency.Store, *sql.DB, string) {
			db, schema := pgDB(t, "pgx", 4)
			return pgStore(t, db), db, schema + ".idempotency_keys"
		}, `UPDATE %s SET created_at = created_at - interval '61 minutes', locked_at = locked_at - interval '61 minutes',
	locked_until = locked_until - interval '61 minutes', expires_at = expires_at - interval '61 minutes',
	retain_until = retain_until - interval '61 minutes'`},
		{"MySQL", func(t *testing.T) (idempotency.Store, *sql.DB, string) {
			d := newMySQLDB(t)
			return d.store(t, 4), d.open(t, 2), "idempotency_keys"
		}, `UPDATE %s SET created_at = created_at - INTERVAL 61 MINUTE, locked_at = locked_at - INTERVAL 61 MINUTE,
	locked_until = locked_until - INTERVAL 61 MINUTE, expires_at = expires_at - INTERVAL 61 MINUTE,
	retain_until = retain_until - INTERVAL 61 MINUTE`},
	}
	for _, d := range dialects {
		for _, tx := range []bool{false, true} {
			t.Run(d.name+map[bool]string{false: "/Ordinary", true: "/Transactional"}[tx], func(t *testing.T) {
				t.Parallel()
				s, db, table := d.store(t)
				age := strings.Replace(d.age, "%s", table, 1)
				mw := newMiddleware(t, s, idempotency.Config{})
				route, err := mw.Route(idempotency.RouteConfig{Name: "orders", Transactional: tx, TTL: time.Hour, Expired: idempotency.ExpiredRefuse, Grace: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				runs := 0
				h := route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs++
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte(`{"order":1}`))
				}))
				key := uuid.NewString()
				if code, body, _ := post(t, h, key, `{"qty":1}`); code != http.StatusCreated {
					t.Fatalf("first call: %d %s", code, body)
				}
				exec(t, db, age)
				for _, body := range []string{`{"qty":1}`, `{"qty":2}`} {
					if code, got, _ := post(t, h, key, body); code != http.StatusUnprocessableEntity || !strings.Contains(got, "idempotency_key_expired") {
						t.Fatalf("past the TTL, body %s: %d %s; want 422 idempotency_key_expired", body, code, got)
					}
				}
				if _, err := mw.Cleanup(t.Context(), 0); err != nil {
					t.Fatalf("Cleanup: %v", err)
				}
				var rows, bodies int
				if err := db.QueryRowContext(t.Context(), `SELECT COUNT(*), COUNT(response_body) + COUNT(response_headers) FROM `+table).Scan(&rows, &bodies); err != nil || rows != 1 || bodies != 0 {
					t.Fatalf("after Cleanup at expiry: %d rows, %d bodies or headers (%v); want the row without them", rows, bodies, err)
				}
				if code, got, _ := post(t, h, key, `{"qty":1}`); code != http.StatusUnprocessableEntity || runs != 1 {
					t.Fatalf("a purged tombstone: %d %s, %d runs; want 422 and 1", code, got, runs)
				}
				exec(t, db, age)
				if _, err := mw.Cleanup(t.Context(), 0); err != nil {
					t.Fatalf("Cleanup after the grace: %v", err)
				}
				if n := countRows(t, db, table); n != 0 {
					t.Fatalf("after Cleanup past the grace: %d rows, want none", n)
				}
				if code, got, _ := post(t, h, key, `{"qty":2}`); code != http.StatusCreated || runs != 2 {
					t.Fatalf("after the grace: %d %s, %d runs; want a new execution", code, got, runs)
				}
			})
		}
	}
}
