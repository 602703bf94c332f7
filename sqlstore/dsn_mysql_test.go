package sqlstore_test

import (
	"bytes"
	"database/sql"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idempotency/sqlstore"
)

// TestMySQLWarnsWithoutDialTimeout: New logs a WARN when the pool's DSN
// (sql.Open's, or mysql.NewConnector's Config) names no dial timeout, and
// none when it does (DESIGN-settled-r3 item 28).
func TestMySQLWarnsWithoutDialTimeout(t *testing.T) {
	t.Parallel()
	d := newMySQLDB(t)
	cfg, err := mysql.ParseDSN(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	without := cfg.Clone()
	without.Timeout = 0
	with := cfg.Clone()
	with.Timeout = 3 * time.Second
	connector := func(c *mysql.Config) *sql.DB {
		conn, err := mysql.NewConnector(c)
		if err != nil {
			t.Fatal(err)
		}
		return sql.OpenDB(conn)
	}
	open := func(dsn string) *sql.DB {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	for _, c := range []struct {
		name string
		db   *sql.DB
		warn bool
	}{
		{"Open without timeout", open(without.FormatDSN()), true},
		{"Open with timeout", open(with.FormatDSN()), false},
		{"Open with timeout=0", open(without.FormatDSN() + "&timeout=0"), true},
		{"NewConnector without Timeout", connector(without), true},
		{"NewConnector with Timeout", connector(with), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer c.db.Close()
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			if _, err := sqlstore.New(t.Context(), c.db, sqlstore.Config{Dialect: sqlstore.MySQL, Logger: log}); err != nil {
				t.Fatalf("New: %v", err)
			}
			got := strings.Contains(buf.String(), "level=WARN") && strings.Contains(buf.String(), "no dial timeout")
			if got != c.warn {
				t.Fatalf("WARN logged: %v, want %v; log: %q", got, c.warn, buf.String())
			}
		})
	}
}
