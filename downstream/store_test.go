package downstream_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // sqlstore's MySQL driver
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // sqlstore's PostgreSQL driver

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/downstream"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/internal/testdb/mysqldb"
	"github.com/idemkit/idempotency/sqlstore"
)

// storeWait bounds each statement a test sends itself.
const storeWait = 30 * time.Second

// sharedStores is one database seen by two stores of their own pools
// (two processes, as far as the database can tell), a way to expire a
// key's row as time would, and to read the derive key id it names.
type sharedStores struct {
	a, b   idempotency.TxStore
	expire func(t *testing.T, key string)
	keyID  func(t *testing.T, key string) string
}

// storeKits are the real stores a row's derive key id lives in.
var storeKits = []struct {
	name string
	open func(t *testing.T) sharedStores
}{
	{"pgx", func(t *testing.T) sharedStores {
		p1 := testdb.New(t)
		ctx, cancel := context.WithTimeout(context.Background(), storeWait)
		defer cancel()
		p2, err := pgxpool.NewWithConfig(ctx, p1.Config())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p2.Close)
		exec := func(t *testing.T, q string, args ...any) {
			ctx, cancel := context.WithTimeout(context.Background(), storeWait)
			defer cancel()
			if _, err := p1.Exec(ctx, q, args...); err != nil {
				t.Fatal(err)
			}
		}
		return sharedStores{
			a: idempotency.NewPostgresStore(p1), b: idempotency.NewPostgresStore(p2),
			expire: func(t *testing.T, key string) { exec(t, pgExpire, key) },
			keyID: func(t *testing.T, key string) (id string) {
				ctx, cancel := context.WithTimeout(context.Background(), storeWait)
				defer cancel()
				if err := p1.QueryRow(ctx, `SELECT derive_key_id FROM idempotency_keys WHERE idem_key = $1`, key).Scan(&id); err != nil {
					t.Fatal(err)
				}
				return id
			},
		}
	}},
	{"sqlstore-postgres", func(t *testing.T) sharedStores {
		return sqlStores(t, "pgx", testdb.NewDSN(t), sqlstore.PostgreSQL, pgExpire,
			`SELECT derive_key_id FROM idempotency_keys WHERE idem_key = $1`)
	}},
	{"sqlstore-mariadb", func(t *testing.T) sharedStores {
		return sqlStores(t, "mysql", mysqldb.New(t).DSN, sqlstore.MySQL,
			`UPDATE idempotency_keys SET locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, retain_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE idem_key = ?`,
			`SELECT derive_key_id FROM idempotency_keys WHERE idem_key = ?`)
	}},
}

// pgExpire makes a key's row expired, its lease over, as time would (an
// ExpiredRunAgain row: retain_until is its expiry).
const pgExpire = `UPDATE idempotency_keys SET locked_until = now() - interval '1 second', expires_at = now() - interval '1 second', retain_until = now() - interval '1 second' WHERE idem_key = $1`

// sqlStores opens two sqlstore stores of dialect on dsn, each on a
// database/sql pool of its own.
func sqlStores(t *testing.T, driver, dsn string, dialect sqlstore.Dialect, expire, keyID string) sharedStores {
	var dbs [2]*sql.DB
	var stores [2]*sqlstore.Store
	for i := range dbs {
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), storeWait)
		defer cancel()
		if stores[i], err = sqlstore.New(ctx, db, sqlstore.Config{Dialect: dialect, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		dbs[i] = db
	}
	return sharedStores{
		a: stores[0], b: stores[1],
		expire: func(t *testing.T, key string) {
			ctx, cancel := context.WithTimeout(context.Background(), storeWait)
			defer cancel()
			if _, err := dbs[0].ExecContext(ctx, expire, key); err != nil {
				t.Fatal(err)
			}
		},
		keyID: func(t *testing.T, key string) (id string) {
			ctx, cancel := context.WithTimeout(context.Background(), storeWait)
			defer cancel()
			if err := dbs[0].QueryRowContext(ctx, keyID, key).Scan(&id); err != nil {
				t.Fatal(err)
			}
			return id
		},
	}
}

// TestKeyStableOnRealStores, on each real store, ordinary and
// transactional routes: a key claimed under derive key A by one
// middleware (its pool) stores A; a retry through a second middleware on
// a pool of its own is a replay; once the row expired, that second
// middleware, whose keyring has rotated to B (A kept derive-only), takes
// the row over (attempt 2) and derives the first run's ids, under A; a
// new key there derives under B. With A removed from the keyring, a
// takeover of the row gets ErrKeyRetired and must not call the
// downstream.
func TestKeyStableOnRealStores(t *testing.T) {
	t.Parallel()
	for _, kit := range storeKits {
		for _, tx := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/Transactional=%v", kit.name, tx), func(t *testing.T) {
				t.Parallel()
				st := kit.open(t)
				ringA := downstream.TestKeyring(t, "A")
				ringBA := downstream.TestKeyring(t, "B", "A")
				ringB := downstream.TestKeyring(t, "B")
				rc := idempotency.RouteConfig{Name: "orders", Transactional: tx}
				route := func(store idempotency.Store, keys idempotency.DeriveKeys) http.Handler {
					return newMiddleware(t, store, keys, on).MustRoute(rc)(deriving(nil))
				}
				first, second, retired := route(st.a, ringA), route(st.b, ringBA), route(st.a, ringB)

				key := uuid.NewString()
				want, w := post(t, first, key, "alice")
				if w.Code != http.StatusCreated || st.keyID(t, key) != "A" {
					t.Fatalf("first run: %d %s, row's derive_key_id %q; want 201, A", w.Code, w.Body, st.keyID(t, key))
				}
				if got, w := post(t, second, key, "alice"); w.Header().Get(idempotency.HeaderReplayed) != "true" || got != want {
					t.Fatalf("a retry through the second pool: %d replayed %q %+v; want the replay of %+v", w.Code, w.Header().Get(idempotency.HeaderReplayed), got, want)
				}

				st.expire(t, key)
				got, w := post(t, second, key, "alice")
				if w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "" {
					t.Fatalf("after expiry: %d replayed %q %s, want the takeover's own run", w.Code, w.Header().Get(idempotency.HeaderReplayed), w.Body)
				}
				if got != want || st.keyID(t, key) != "A" {
					t.Errorf("the takeover under keyring B,A derived %+v (row names %q), want the first run's %+v under A", got, st.keyID(t, key), want)
				}

				other := uuid.NewString()
				if got, w := post(t, second, other, "alice"); w.Code != http.StatusCreated || st.keyID(t, other) != "B" || got.Entry == want.Entry {
					t.Errorf("a new key under keyring B,A: %d, row names %q, id %q; want 201 under B, another id", w.Code, st.keyID(t, other), got.Entry)
				}

				st.expire(t, key)
				got, w = post(t, retired, key, "alice")
				if w.Code != http.StatusServiceUnavailable || !strings.Contains(got.Err, downstream.ErrKeyRetired.Error()) {
					t.Errorf("a takeover with A retired: %d %+v, want the handler's 503 with ErrKeyRetired", w.Code, got)
				}
			})
		}
	}
}
