package testdb

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// EnvSkipLog names a file to which each test skipped for want of a
// database (or of PgBouncer) appends one line, its package's directory and
// why, tab-separated. go test prints a passing package's skips only with
// -v, so make test sets it and ends with one line per package that ran
// without a database.
const EnvSkipLog = "IDEMPOTENCY_TEST_SKIP_LOG"

// Skip skips tb with msg, noting why (a short reason shared by the tests
// that skip alike, such as "no NATS: set IDEMPOTENCY_TEST_NATS_URL") in the
// skip log when one is set, so make test's summary names every test group
// that skipped for want of a service or a tool, not only the databases.
func Skip(tb testing.TB, why, msg string) {
	tb.Helper()
	if path := os.Getenv(EnvSkipLog); path != "" {
		if err := appendSkip(path, why); err != nil {
			tb.Logf("testdb: could not note the skip in %s: %v", path, err)
		}
	}
	tb.Skip(msg)
}

// appendSkip appends one line, in a single write: the test binaries of
// several packages append to the same file at once.
func appendSkip(path, why string) error {
	dir, err := os.Getwd() // go test runs a package's tests in its directory
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s\t%s\n", dir, why)
	return errors.Join(err, f.Close())
}
