package idempotency_test

import (
	"slices"
	"testing"

	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresSchemaCitusReady: after migrating, the catalog shows the
// table can be distributed by scope_user_id (Citus): the primary key is
// (scope_user_id, id) and every unique constraint or index holds
// scope_user_id. Citus refuses create_distributed_table otherwise. (Pinned
// here on plain PostgreSQL; README, "Scale-out (Citus)", says what ran on a
// real Citus cluster.)
func TestPostgresSchemaCitusReady(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := t.Context()

	var pk []string
	err := pool.QueryRow(ctx, `SELECT array_agg(a.attname::text ORDER BY k.ord)
		FROM pg_constraint c
		CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
		WHERE c.conrelid = 'idempotency_keys'::regclass AND c.contype = 'p'`).Scan(&pk)
	if err != nil {
		t.Fatalf("primary key: %v", err)
	}
	if want := []string{"scope_user_id", "idem_key", "scope_endpoint"}; !slices.Equal(pk, want) {
		t.Errorf("primary key columns %v, want %v", pk, want)
	}

	rows, err := pool.Query(ctx, `SELECT i.indexrelid::regclass::text,
			coalesce(array_agg(a.attname::text) FILTER (WHERE a.attname IS NOT NULL), '{}')
		FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) AS k(attnum)
		LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = 'idempotency_keys'::regclass AND i.indisunique
		GROUP BY i.indexrelid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	unique := 0
	for rows.Next() {
		var (
			name string
			cols []string
		)
		if err := rows.Scan(&name, &cols); err != nil {
			t.Fatal(err)
		}
		unique++
		if !slices.Contains(cols, "scope_user_id") {
			t.Errorf("unique index %s on %v lacks the distribution column scope_user_id", name, cols)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if unique != 1 { // the primary key, uq_idem_key_user_endpoint
		t.Errorf("%d unique indexes, want 1", unique)
	}
}
