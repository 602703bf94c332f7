package sqlstore_test

import (
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/internal/testdb/mysqldb"
	"github.com/idemkit/idempotency/sqlstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// newMiddleware is this package's one middleware builder: New over s with
// cfg, quiet, its metrics in a registry of its own and the kill-switch on,
// unless cfg says otherwise. It fails the test when New fails.
func newMiddleware(t testing.TB, s idempotency.Store, cfg idempotency.Config) *idempotency.Middleware {
	t.Helper()
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Enabled == nil {
		cfg.Enabled = func(context.Context) bool { return true }
	}
	mw, err := idempotency.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// mysqlDB is one test's MariaDB database: migrated, dropped when the
// test ends.
type mysqlDB struct {
	mysqldb.DB
	dsn, name string
}

// newMySQLDB creates a database of its own for t on the server of
// IDEMPOTENCY_TEST_MYSQL_URL (skipping without it) and migrates it.
func newMySQLDB(t testing.TB) mysqlDB {
	t.Helper()
	d := mysqldb.New(t)
	return mysqlDB{DB: d, dsn: d.DSN, name: d.Name}
}

// open opens a pool on d, closed when the test ends.
func (d mysqlDB) open(t testing.TB, maxConns int) *sql.DB { return d.Open(t, maxConns) }

// store returns a Store on a pool of its own on d.
func (d mysqlDB) store(t testing.TB, maxConns int) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(t.Context(), d.open(t, maxConns), sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// exec runs statements on db.
func exec(t testing.TB, db *sql.DB, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := db.ExecContext(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", strings.SplitN(s, "\n", 2)[0], err)
		}
	}
}
