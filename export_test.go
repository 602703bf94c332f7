package idempotency

// The Postgres statements, for the raw-SQL floor benchmarks in the external
// test package.
const (
	ClaimSQLForTest    = pgClaimSQL
	CompleteSQLForTest = pgCompleteSQL
)
