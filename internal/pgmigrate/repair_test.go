package pgmigrate_test

import (
	"errors"
	"testing"
	"testing/fstest"

	"github.com/golang-migrate/migrate/v4"

	"github.com/idemkit/idempotency/internal/pgmigrate"
	"github.com/idemkit/idempotency/internal/testdb"
)

// Two releases of one migration set: the older knows 1 and 2, the newer
// adds 3, whose body fails (and rolls back whole).
var (
	olderRelease = fstest.MapFS{
		"000001_a.up.sql":   {Data: []byte(`CREATE TABLE a (id int);`)},
		"000001_a.down.sql": {Data: []byte(`DROP TABLE a;`)},
		"000002_b.up.sql":   {Data: []byte(`CREATE TABLE b (id int);`)},
		"000002_b.down.sql": {Data: []byte(`DROP TABLE b;`)},
	}
	newerRelease = fstest.MapFS{
		"000001_a.up.sql":   olderRelease["000001_a.up.sql"],
		"000001_a.down.sql": olderRelease["000001_a.down.sql"],
		"000002_b.up.sql":   olderRelease["000002_b.up.sql"],
		"000002_b.down.sql": olderRelease["000002_b.down.sql"],
		"000003_c.up.sql":   {Data: []byte(`CREATE TABLE c (id int); SELECT 1/0;`)},
		"000003_c.down.sql": {Data: []byte(`DROP TABLE c;`)},
	}
)

// TestRepairUsesVersionReadUnderTheLock: another replica (an older release,
// mid rolling deploy) applies migration 2 after this Run began but before
// it took the lock; this Run's migration 3 then fails. The version goes
// back to 2, read under the lock, not to the 1 seen when the Run began
// (every later Up would then re-run 2 and fail). Found by a review.
//
// The other replica's Up runs inside op, before op calls golang-migrate:
// the window between the Run's start and the lock.
func TestRepairUsesVersionReadUnderTheLock(t *testing.T) {
	t.Parallel()
	pool := testdb.NewEmpty(t)
	ctx := t.Context()

	newer, err := pgmigrate.New(ctx, pool, newerRelease)
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Close()
	older, err := pgmigrate.New(ctx, pool, olderRelease)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()

	if err := older.Run(ctx, func(m *migrate.Migrate) error { return m.Steps(1) }); err != nil {
		t.Fatal(err)
	}
	err = newer.Run(ctx, func(m *migrate.Migrate) error {
		// The other replica gets the lock first and applies 2.
		if err := older.Up(ctx); err != nil {
			t.Errorf("older replica's Up: %v", err)
		}
		return m.Up() // applies 3: its body fails
	})
	if err == nil {
		t.Fatal("Up with a failing migration 3 succeeded")
	}
	var bExists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('b') IS NOT NULL`).Scan(&bExists); err != nil {
		t.Fatal(err)
	}
	v, dirty := state(t, older)
	if !bExists {
		t.Fatal("setup: migration 2 was not applied")
	}
	if v != 2 || dirty {
		t.Errorf("after the failed migration 3 (migration 2 applied, table b exists): version %d dirty %v; want 2, clean", v, dirty)
	}
	// The consequence: the older replica's next Up (any restart) fails.
	if err := older.Up(ctx); err != nil {
		t.Errorf("next Up after the repair: %v", err)
	}
}

// TestRepairBeforeUnlock: the version is put back before golang-migrate
// releases its lock, so another replica starting right after the failed
// Up never finds it dirty (golang-migrate's "Dirty database version ...
// Fix and force version"). Found by a review: the repair used to follow
// the unlock. (The window is pinned by calling the other replica right
// after m.Up returns, inside op.)
func TestRepairBeforeUnlock(t *testing.T) {
	t.Parallel()
	pool := testdb.NewEmpty(t)
	ctx := t.Context()
	failing := fstest.MapFS{
		"000001_a.up.sql":   {Data: []byte(`CREATE TABLE a (id int); SELECT 1/0;`)},
		"000001_a.down.sql": {Data: []byte(`DROP TABLE a;`)},
	}
	a, err := pgmigrate.New(ctx, pool, failing)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := pgmigrate.New(ctx, pool, failing)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var other error
	err = a.Run(ctx, func(m *migrate.Migrate) error {
		err := m.Up()
		other = b.Up(ctx) // another replica, between the unlock and the repair
		return err
	})
	if err == nil {
		t.Fatal("the failing migration succeeded")
	}
	var dirty migrate.ErrDirty
	if errors.As(other, &dirty) {
		t.Errorf("another replica saw a dirty version while this one was about to repair it: %v", other)
	}
}
