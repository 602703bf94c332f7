package idempotency

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestIsRowLockWait: a lock wait is the key's row when its context names
// a tuple by its id, in any language PostgreSQL reports it in; a
// table-level lock wait names none.
func TestIsRowLockWait(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code, where string
		want        bool
	}{
		{"55P03", `while checking uniqueness of tuple (0,5) in relation "idempotency_keys"`, true},
		{"55P03", `while locking tuple (12,3) in relation "idempotency_keys"`, true},
		{"55P03", `beim Prüfen der Eindeutigkeit von Tupel (0,5) in Relation »idempotency_keys«`, true},
		{"55P03", `SQL statement "INSERT INTO idempotency_keys ..."`, false}, // a table lock
		{"55P03", ``, false},
		{"40001", `while locking tuple (0,1) in relation "idempotency_keys"`, false},
	} {
		err := fmt.Errorf("claim: %w", &pgconn.PgError{Code: c.code, Where: c.where})
		if got := isRowLockWait(err); got != c.want {
			t.Errorf("%s %q: %v, want %v", c.code, c.where, got, c.want)
		}
	}
}
