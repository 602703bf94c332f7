package sqlstore_test

import (
	"context"
	"database/sql"
	"net/url"
	"strings"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "github.com/lib/pq"              // database/sql driver "postgres"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/sqlstore"
)

// pgDrivers are the database/sql drivers the PostgreSQL dialect is tested
// on.
var pgDrivers = []string{"pgx", "postgres"}

// pgDB opens a pool of driver on a new migrated schema of the test server
// (the pgx store's table), closed when the test ends.
func pgDB(t testing.TB, driver string, maxConns int) (*sql.DB, string) {
	t.Helper()
	dsn := testdb.NewDSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := strings.TrimPrefix(u.Query().Get("options"), "-csearch_path=")
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db, schema
}

// pgStore is a database/sql store on db.
func pgStore(t testing.TB, db *sql.DB) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(context.Background(), db, sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// TestPostgresKit runs the whole suite on the PostgreSQL dialect, on pgx's
// stdlib and on lib/pq.
func TestPostgresKit(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			idempotencytest.Run(t, func(t *testing.T) idempotency.Store {
				db, _ := pgDB(t, driver, 4)
				return pgStore(t, db)
			})
		})
	}
}

// TestPostgresKitTx runs the transactional part on both drivers.
func TestPostgresKitTx(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			dbs := map[*testing.T]*sql.DB{}
			idempotencytest.RunTx(t, func(t *testing.T) idempotency.TxStore {
				db, _ := pgDB(t, driver, 4)
				exec(t, db, "CREATE TABLE ledger (id BIGSERIAL PRIMARY KEY, note TEXT)")
				mu.Lock()
				dbs[t] = db
				mu.Unlock()
				return pgStore(t, db)
			}, func(ctx context.Context, tx any) error {
				_, err := tx.(*sql.Conn).ExecContext(ctx, "INSERT INTO ledger (note) VALUES ('x')")
				return err
			}, func(t *testing.T) int {
				mu.Lock()
				db := dbs[t]
				mu.Unlock()
				return countRows(t, db, "ledger")
			})
		})
	}
}
