package testdb

import (
	"fmt"
	"os"
	"testing"
)

const (
	// EnvMySQLURL names the MySQL/MariaDB server the tests use, as a
	// mysql://user:pass@host:port/db URL.
	EnvMySQLURL = "IDEMPOTENCY_TEST_MYSQL_URL"
	// EnvRequireMySQL, set to 1 (as in CI), fails the tests that need
	// MySQL/MariaDB instead of skipping them when EnvMySQLURL is unset.
	EnvRequireMySQL = "IDEMPOTENCY_REQUIRE_MYSQL"
)

// MySQLURL returns the MySQL/MariaDB server's URL from EnvMySQLURL, or
// skips the test with one line naming the variable (fails it with
// IDEMPOTENCY_REQUIRE_MYSQL=1). The driver is the caller's: this package
// does not import it.
func MySQLURL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv(EnvMySQLURL); u != "" {
		return u
	}
	msg := fmt.Sprintf("testdb: no MySQL/MariaDB: set %s (e.g. mysql://root@127.0.0.1:3306/test)", EnvMySQLURL)
	if os.Getenv(EnvRequireMySQL) == "1" {
		tb.Fatal(msg)
	}
	Skip(tb, "no MySQL/MariaDB: set "+EnvMySQLURL, msg)
	return ""
}
