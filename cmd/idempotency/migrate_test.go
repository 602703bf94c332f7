package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) { // migrated by testdb and mysqldb
		latest := uint(5) // PostgreSQL: 000005 (round 4: 000002 to 000005); MySQL/MariaDB: 000002_round4
		if db.sqlDB != nil {
			latest = 2
		}
		r := runDB(t, db.dsn, "migrate", "version")
		wantCode(t, r, exitOK)
		if r.stdout != fmt.Sprintf("%d\n", latest) {
			t.Errorf("version printed %q, want %d", r.stdout, latest)
		}

		for range 2 {
			r = runDB(t, db.dsn, "migrate", "up")
			wantCode(t, r, exitOK)
			if !strings.Contains(r.stdout, fmt.Sprintf("already at version %d: nothing to apply", latest)) {
				t.Errorf("up on a migrated schema printed %q", r.stdout)
			}
		}

		db.complete(t, newKey(), "7", "POST /x", time.Hour, jsonResp(201, `{"id":1}`))

		// down refuses without --yes and leaves the table alone.
		r = runDB(t, db.dsn, "migrate", "down")
		wantCode(t, r, exitUsage)
		if n := db.count(t, "true"); n != 1 {
			t.Fatalf("%d rows after a refused down, want 1", n)
		}

		r = runDB(t, db.dsn, "migrate", "down", "--yes")
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, fmt.Sprintf("version %d -> none", latest)) {
			t.Errorf("down printed %q", r.stdout)
		}
		if db.tableExists(t) {
			t.Error("idempotency_keys still exists after down --yes")
		}
		r = runDB(t, db.dsn, "migrate", "version")
		wantCode(t, r, exitOK)
		if r.stdout != "none\n" {
			t.Errorf("version after down printed %q, want none", r.stdout)
		}
		r = runDB(t, db.dsn, "migrate", "--yes", "down")
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, "nothing to roll back") {
			t.Errorf("second down printed %q", r.stdout)
		}

		r = runDB(t, db.dsn, "--json", "migrate", "up")
		wantCode(t, r, exitOK)
		var up struct {
			Action  string
			Changed bool
			From    *uint
			To      *uint
		}
		if err := json.Unmarshal([]byte(r.stdout), &up); err != nil {
			t.Fatalf("migrate up --json: %v\n%s", err, r.stdout)
		}
		if up.Action != "up" || !up.Changed || up.From != nil || up.To == nil || *up.To != latest {
			t.Errorf("migrate up --json = %+v", up)
		}
		if n := db.count(t, "true"); n != 0 {
			t.Errorf("%d rows in the re-created table", n)
		}

		r = runDB(t, db.dsn, "migrate", "version", "--json")
		wantCode(t, r, exitOK)
		var v versionJSON
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Version == nil || *v.Version != latest || v.Dirty {
			t.Errorf("version --json = %s (%v)", r.stdout, err)
		}
	})
}

// TestMigrateHelpNamesTheLatest: `migrate --help` names each dialect's
// latest migration, the version `migrate version` prints after `up`
// (TestMigrate), as the embedded migrations have it.
func TestMigrateHelpNamesTheLatest(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "migrate", "--help")
	wantCode(t, r, exitOK)
	const want = "the latest is 5 on PostgreSQL, 2 on\n           MySQL/MariaDB"
	if !strings.Contains(r.stdout, want) {
		t.Errorf("migrate --help does not say %q:\n%s", want, r.stdout)
	}
}
