// Command ablation writes the schemas and pgbench scripts of the storage
// ablation (bench/ablation.sh; make bench/ablation): one candidate schema
// change at a time on top of the schema before issue #27, each run with
// the store's own statements, read from the source files of a revision
// (-before, a directory holding that revision's store_pg_sql.go,
// store_pg_tx_sql.go and migrations/000001 up file) and of the working
// tree (-after), so the table compares like with like.
//
// For each candidate it writes NAME.schema.sql (the idempotency_keys table
// as the candidate has it, plus the example's order tables), NAME.sql (the
// script pgbench runs), NAME.setup.sql (run once by one client before the
// runs: the hot key's completed row, where the script replays it) and
// NAME.vars (the pgbench -D variables, one a line). The candidates, in the
// order of the table:
//
//	floor_commit   one one-row INSERT per transaction into a table with no index: the WAL-flush ceiling
//	floor_2commit  two of them, each its own transaction: the ceiling of any two-commit design
//	floor_narrow   claim + record on a narrow table: one unique index, no JSONB, a bytea hash
//	before         today's claim + record (pgClaimSQL, pgCompleteSQL) on today's schema
//	no_user_idx    before, without idx_idem_keys_user
//	natpk          the natural key (scope_user_id, idem_key, scope_endpoint) as the primary key, id kept unindexed
//	natpk_noid     natpk without the id column (the record fenced on the key and attempt)
//	hash32         before with request_hash a 32-byte bytea
//	bytea          before with response_body and response_headers bytea
//	combined       natpk + hash32 + bytea
//	combined_ff80  combined with fillfactor 80
//	after          the working tree's statements on the working tree's migration
//	after_brin     after with idx_idem_keys_expires a BRIN index (a summary per range of pages) instead of a B-tree
//	after_noexp    after without idx_idem_keys_expires: the floor of any cheaper index on expires_at
//	after_insert   after with the claim as the plain INSERT ... RETURNING of a transactional route (a loser reads the row in a second statement)
//	after_insert_pipe  after_insert with the read of the row pipelined after the INSERT, one round trip, on every claim
//	after_async_claim  after with the claim committed without waiting for its WAL flush (the record synchronous): a commit's flush fewer per new key
//	after_pipe_claim   after_async_claim's script with the flush kept: its control
//	hot_insert     a replay under after_insert: the INSERT that inserts nothing, then the read, two round trips
//	hot_insert_pipe    the same two statements pipelined: one round trip
//	hot_before, hot_combined, hot_after   a replay (the claim of a completed key)
//	hot_lookup     combined with the claim shaped as a plain lookup first
//	miss_lookup    the same claim on new keys
//	tx_order       the bare order transaction (the example's two writes)
//	tx_before      the transactional route's statements before, pipelined as the store sends them
//	tx_combined    the same statements on the combined schema
//	tx_after       the working tree's transactional statements
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkit/idempotency/bench/internal/gosrc"
	"github.com/idemkit/idempotency/bench/internal/pgbscript"
)

// The values every script's rows carry: the no-op route's (bench/cmd/
// noopserver) for the ordinary candidates, the example's order route's for
// the transactional ones.
const (
	hashHex    = "5f1e3d0b9c8a7f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291807f6e"
	hotKey     = "0b6f3c1e-9a2d-4e7f-8c5b-3d1a2e4f6a8b"
	noopBody   = `{"ok":true}`
	noopHeader = `{"Content-Type":["application/json"]}`
	orderBody  = `{"id":1,"symbol":"AAPL","side":"buy","qty":1,"status":"filled","fill_price":187.43}`
	orderHead  = `{"Content-Type":["application/json"],"Location":["/api/trading/orders/1"]}`
)

type candidate struct {
	name, schema, setup, script string
	vars                        []string
}

func main() {
	before := flag.String("before", "", "directory holding the before revision's statements (internal/pgsql/pgsql.go, or store_pg_sql.go and store_pg_tx_sql.go) and 000001 up migration")
	after := flag.String("after", "..", "the working tree's root")
	out := flag.String("out", ".", "directory to write into")
	flag.Parse()
	cands, err := build(*before, *after)
	if err == nil {
		err = write(*out, cands)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ablation:", err)
		os.Exit(1)
	}
}

func write(out string, cands []candidate) error {
	var names []string
	for _, c := range cands {
		names = append(names, c.name)
		for ext, body := range map[string]string{".schema.sql": c.schema, ".setup.sql": c.setup, ".sql": c.script,
			".vars": strings.Join(c.vars, "\n") + "\n"} {
			if err := os.WriteFile(filepath.Join(out, c.name+ext), []byte(body), 0o644); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(filepath.Join(out, "candidates"), []byte(strings.Join(names, "\n")+"\n"), 0o644)
}

// src is one revision's statements and migration.
type src struct {
	consts    map[string]string
	migration string
}

func load(dir string) (src, error) {
	consts, err := gosrc.PostgresStatements(dir)
	if err != nil {
		return src{}, err
	}
	m, err := filepath.Glob(filepath.Join(dir, "migrations", "000001_*.up.sql"))
	if err != nil || len(m) != 1 {
		return src{}, fmt.Errorf("%s: no single 000001 up migration", dir)
	}
	b, err := os.ReadFile(m[0])
	return src{consts, string(b)}, err
}

// must replaces old with new in s, and fails when old is not there: a
// candidate that silently changed nothing would measure the baseline.
func must(s, old, new string) string {
	if !strings.Contains(s, old) {
		panic(fmt.Sprintf("ablation: %q not found in %q", old, s))
	}
	return strings.ReplaceAll(s, old, new)
}

func build(beforeDir, afterDir string) (cands []candidate, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	b, err := load(beforeDir)
	if err != nil {
		return nil, err
	}
	a, err := load(afterDir)
	if err != nil {
		return nil, err
	}
	ex, err := gosrc.StringConsts(filepath.Join(afterDir, "examples", "server", "postgres.go"))
	if err != nil {
		return nil, err
	}
	orderSchema := ex["schemaSQL"]

	// The schema variants, as edits of before's migration.
	base := b.migration
	noUserIdx := base + "\nDROP INDEX idx_idem_keys_user;\n"
	natpk := must(must(base, "PRIMARY KEY (scope_user_id, id),\n    CONSTRAINT uq_idem_key_user_endpoint\n        UNIQUE (idem_key, scope_user_id, scope_endpoint)",
		"CONSTRAINT uq_idem_key_user_endpoint\n        PRIMARY KEY (scope_user_id, idem_key, scope_endpoint)"),
		"CREATE INDEX idx_idem_keys_user\n    ON idempotency_keys (scope_user_id)\n    WHERE scope_user_id <> '';", "")
	natpkNoID := must(natpk, "id                 BIGSERIAL      NOT NULL,\n", "")
	hash32 := func(s string) string {
		return must(s, "request_hash       TEXT", "request_hash       BYTEA")
	}
	bytea := func(s string) string {
		return must(must(s, "response_body      JSONB", "response_body      BYTEA"), "response_headers   JSONB", "response_headers   BYTEA")
	}
	combined := bytea(hash32(natpk))
	ff80 := combined + "\nALTER TABLE idempotency_keys SET (fillfactor = 80);\n"

	// The statements, bound to pgbench variables.
	claimArgs := []string{":key", ":scope", ":endpoint", ":hash", ":ttl", ":lease", ":owner", "''"}
	claim := func(sql, key string) string {
		return pgbscript.OneLine(pgbscript.Bind(sql, append([]string{key}, claimArgs[1:]...)))
	}
	complete := pgbscript.OneLine(pgbscript.Bind(b.consts["pgCompleteSQL"], []string{":c_id", ":c_attempt", ":scope", ":code", ":body", "NULL", ":headers", "NULL"}))
	byKey := func(s, key string) string {
		return must(s, "WHERE scope_user_id = :scope AND id = :c_id", "WHERE scope_user_id = :scope AND idem_key = "+key+" AND scope_endpoint = :endpoint AND id = :c_id")
	}
	noID := func(s string) string { return must(s, "id, request_hash", "request_hash") }
	newKey := "\\set key random(1, 9223372036854775806)\n"
	bClaim := b.consts["pgClaimSQL"]
	miss := func(claimSQL, completeSQL string) string {
		return newKey + claim(claimSQL, ":key") + "\n\\gset c_\n" + completeSQL + ";\n"
	}
	hotSetup := func(claimSQL, completeSQL string) string {
		return claim(claimSQL, ":hotkey") + "\n\\gset c_\n" + strings.ReplaceAll(completeSQL, ":key", ":hotkey") + ";\n"
	}
	common := []string{"ttl=24 hours", "lease=30 seconds", "owner=3c9d2f4e-8b1a-4c6d-9e7f-1a2b3c4d5e6f", "hotkey=" + hotKey,
		"scope=1", "endpoint=POST /noop", "code=201", "body=" + noopBody, "headers=" + noopHeader}
	textVars := append([]string{"hash=" + hashHex}, common...)
	byteaVars := append([]string{`hash=\x` + hashHex}, common...)
	schemaOf := func(table string) string { return table + "\n" + orderSchema }

	// The lookup-first claim: a plain read of the key's row, and the
	// insert only when it found none, in one statement.
	lookup := lookupClaim(b.consts)

	// The after revision's own statements (the store's claim and record).
	aClaim, aComplete := a.consts["pgClaimSQL"], a.consts["pgCompleteSQL"]
	aCompleteArgs := completeParams(aComplete)
	aCompleteSQL := pgbscript.OneLine(pgbscript.Bind(aComplete, aCompleteArgs))
	afterVars := textVars
	if strings.Contains(a.migration, "request_hash       BYTEA") && !strings.Contains(aClaim, "decode($4, 'hex')") {
		afterVars = byteaVars
	}
	afterMiss := newKey + claim(aClaim, ":key") + "\n\\gset c_\n" + aCompleteSQL + ";\n"

	ord := func(name, schema string, vars []string, script string) candidate {
		return candidate{name: name, schema: schemaOf(schema), script: script, vars: vars}
	}
	cands = []candidate{
		{name: "floor_commit", schema: "CREATE TABLE floor1 (k bigint);\n", script: newKey + "INSERT INTO floor1 VALUES (:key);\n", vars: textVars},
		{name: "floor_2commit", schema: "CREATE TABLE floor1 (k bigint);\n", script: newKey + "INSERT INTO floor1 VALUES (:key);\nINSERT INTO floor1 VALUES (:key);\n", vars: textVars},
		{name: "floor_narrow", schema: narrowSchema, script: newKey + narrowClaim + "\n\\gset c_\n" + narrowComplete + ";\n", vars: byteaVars},
		ord("before", base, textVars, miss(bClaim, complete)),
		ord("no_user_idx", noUserIdx, textVars, miss(bClaim, complete)),
		ord("natpk", natpk, textVars, miss(bClaim, byKey(complete, ":key"))),
		ord("natpk_noid", natpkNoID, textVars, miss(noID(bClaim), must(byKey(complete, ":key"), " AND id = :c_id", ""))),
		ord("hash32", hash32(base), byteaVars, miss(bClaim, complete)),
		ord("bytea", bytea(base), textVars, miss(bClaim, complete)),
		ord("combined", combined, byteaVars, miss(bClaim, byKey(complete, ":key"))),
		ord("combined_ff80", ff80, byteaVars, miss(bClaim, byKey(complete, ":key"))),
		ord("after", a.migration, afterVars, afterMiss),
		// The record committed without waiting for its WAL flush (the
		// claim stays synchronous): BEGIN, SET LOCAL synchronous_commit =
		// off, the record and COMMIT in one pipeline.
		ord("after_async_record", a.migration, afterVars, newKey+claim(aClaim, ":key")+"\n\\gset c_\n"+
			"\\startpipeline\nBEGIN;\nSET LOCAL synchronous_commit = 'off';\n"+aCompleteSQL+";\nCOMMIT;\n\\endpipeline\n"),
		ord("miss_lookup", combined, byteaVars, miss(lookup, byKey(complete, ":key"))),
		ord("after_brin", must(a.migration, "CREATE INDEX idx_idem_keys_expires\n    ON idempotency_keys (expires_at);",
			"CREATE INDEX idx_idem_keys_expires\n    ON idempotency_keys USING brin (expires_at);"), afterVars, afterMiss),
		ord("after_noexp", must(a.migration, "CREATE INDEX idx_idem_keys_expires\n    ON idempotency_keys (expires_at);", ""), afterVars, afterMiss),
		ord("after_insert", a.migration, afterVars, newKey+claim(a.consts["pgTxClaimSQL"], ":key")+"\n\\gset c_\n"+aCompleteSQL+";\n"),
	}
	hot := func(name, schema string, vars []string, claimSQL, completeSQL string) candidate {
		c := ord(name, schema, vars, claim(claimSQL, ":hotkey")+";\n")
		c.setup = hotSetup(claimSQL, completeSQL)
		return c
	}
	cands = append(cands,
		hot("hot_before", base, textVars, bClaim, complete),
		hot("hot_combined", combined, byteaVars, bClaim, byKey(complete, ":key")),
		hot("hot_lookup", combined, byteaVars, lookup, byKey(complete, ":key")),
		hot("hot_after", a.migration, afterVars, aClaim, aCompleteSQL),
	)
	// The claim as a plain INSERT, and the read of the row when it inserted
	// nothing (pgTxReadSQL, bound like the claim).
	aInsert, aRead := claim(a.consts["pgTxClaimSQL"], ":key"), pgbscript.OneLine(pgbscript.Bind(a.consts["pgTxReadSQL"], []string{":key", ":scope", ":endpoint"}))
	pipe := func(key string) string {
		return "\\startpipeline\n" + strings.ReplaceAll(aInsert, ":key", key) + ";\n" + strings.ReplaceAll(aRead, ":key", key) + ";\n\\endpipeline\n"
	}
	// pgbench has no \gset in a pipeline: the record finds the id by the
	// key (one index probe more than the store's) and the attempt is 1.
	recordByKey := must(must(aCompleteSQL, ":c_id", "(SELECT id FROM idempotency_keys WHERE idem_key = :key AND scope_user_id = :scope AND scope_endpoint = :endpoint)"), ":c_attempt", "1")
	insPipe := ord("after_insert_pipe", a.migration, afterVars, newKey+pipe(":key")+recordByKey+";\n")
	hotIns := ord("hot_insert", a.migration, afterVars, strings.ReplaceAll(aInsert, ":key", ":hotkey")+";\n"+strings.ReplaceAll(aRead, ":key", ":hotkey")+";\n")
	hotIns.setup = hotSetup(aClaim, aCompleteSQL)
	hotPipe := ord("hot_insert_pipe", a.migration, afterVars, pipe(":hotkey"))
	hotPipe.setup = hotSetup(aClaim, aCompleteSQL)
	// The claim in BEGIN; SET LOCAL synchronous_commit = off; ...; COMMIT
	// (one pipeline), the record as deployed: what a new key costs with
	// one WAL flush instead of two.
	asyncClaim := ord("after_async_claim", a.migration, afterVars, newKey+"\\startpipeline\nBEGIN;\nSET LOCAL synchronous_commit = 'off';\n"+
		claim(aClaim, ":key")+";\nCOMMIT;\n\\endpipeline\n"+recordByKey+";\n")
	// Its control: the same script with the claim's flush kept.
	syncClaim := ord("after_pipe_claim", a.migration, afterVars, strings.Replace(asyncClaim.script, "SET LOCAL synchronous_commit = 'off';\n", "", 1))
	cands = append(cands, insPipe, hotIns, hotPipe, asyncClaim, syncClaim)
	// The transactional route: the order's writes, bare and inside the
	// store's pipelines (as bench/cmd/pgbenchsql writes them).
	orderVars := func(v []string) []string {
		out := append([]string{}, v...)
		for i, s := range out {
			switch {
			case strings.HasPrefix(s, "endpoint="):
				out[i] = "endpoint=POST /api/trading/orders"
			case strings.HasPrefix(s, "body="):
				out[i] = "body=" + orderBody
			case strings.HasPrefix(s, "headers="):
				out[i] = "headers=" + orderHead
			}
		}
		return out
	}
	writes := pgbscript.OneLine(pgbscript.Bind(ex["insertOrderSQL"], []string{"1", "'AAPL'", "'buy'", "1", "'filled'", "187.43", ":key"})) + ";\n" +
		pgbscript.OneLine(pgbscript.Bind(ex["insertOrderPlacedSQL"], []string{"1", `'{"order_id":1,"symbol":"AAPL","side":"buy","qty":1,"client_order_id":"0b6f3c1e-9a2d-4e7f-8c5b-3d1a2e4f6a8b"}'`})) + ";\n"
	cands = append(cands,
		ord("tx_order", base, orderVars(textVars), newKey+"BEGIN;\n"+writes+"COMMIT;\n"),
		ord("tx_before", base, orderVars(textVars), newKey+txScript(b.consts, writes, false)),
		ord("tx_combined", combined, orderVars(byteaVars), newKey+txScript(b.consts, writes, true)),
		ord("tx_after", a.migration, orderVars(afterVars), newKey+txScript(a.consts, writes, false)),
		ord("tx_after_fold", a.migration, orderVars(afterVars), newKey+txFold(txScript(a.consts, writes, false))),
		ord("tx_after_nosavepoint", a.migration, orderVars(afterVars), newKey+must(txScript(a.consts, writes, false), pgbscript.OneLine(a.consts["pgSavepointSQL"])+";\n", "")),
	)
	return cands, nil
}

// completeParams binds pgCompleteSQL's parameters as its doc comment
// names them: $1 id, $2 attempt, $3 scope, $4 status, $5 body, $6 raw
// body, $7 headers, $8 seal key id and, since the natural primary key,
// $9 key and $10 endpoint.
func completeParams(sql string) []string {
	args := []string{":c_id", ":c_attempt", ":scope", ":code", ":body", "NULL", ":headers", "NULL"}
	if strings.Contains(sql, "$10") {
		args = append(args, ":key", ":endpoint")
	}
	return args
}

// txScript is the transactional route's statements as the store pipelines
// them (bench/cmd/pgbenchsql's order_idem_tx_all.sql): BEGIN, the bounds,
// the lock wait, the claim, the savepoint and the lock wait back in one
// pipeline; the order's writes; the claim's state back, the deferred
// constraints checked, the record, COMMIT and the session's state read in
// another.
func txScript(c map[string]string, writes string, natural bool) string {
	claimArgs := []string{":key", ":scope", ":endpoint", ":hash", ":ttl", ":lease", ":owner", "''"}
	claimPipe := "\\startpipeline\nBEGIN;\n" + pgbscript.OneLine(pgbscript.Bind(c["pgTxBoundsSQL"], []string{"'30000ms'"})) + ";\n" +
		"SET LOCAL lock_timeout = '10ms';\n" + pgbscript.OneLine(pgbscript.Bind(c["pgTxClaimSQL"], claimArgs)) + ";\n" +
		pgbscript.OneLine(c["pgSavepointSQL"]) + ";\nSET LOCAL lock_timeout = '0';\n\\endpipeline\n"
	byKey := "(SELECT id FROM idempotency_keys WHERE idem_key = :key::text AND scope_user_id = :scope AND scope_endpoint = :endpoint)"
	args := []string{byKey, "1", ":scope", ":code", ":body", "NULL", ":headers", "NULL"}
	if strings.Contains(c["pgCompleteSQL"], "$10") {
		args = append(args, ":key::text", ":endpoint")
	}
	record := pgbscript.OneLine(pgbscript.Bind(c["pgTxCompleteSQL"], args))
	if natural { // the natural key as the primary key: the row found by it, the id a check
		record = must(record, "WHERE scope_user_id = :scope AND id = ", "WHERE scope_user_id = :scope AND idem_key = :key::text AND scope_endpoint = :endpoint AND id = ")
	}
	recordPipe := "\\startpipeline\n" + pgbscript.OneLine(pgbscript.Bind(c["pgTxRestoreSQL"], []string{"'30000ms'", "current_setting('search_path')", "'30000ms'"})) + ";\n" +
		"SET LOCAL ROLE NONE;\nSET LOCAL synchronous_commit = 'on';\nSET LOCAL lock_timeout = '0';\n" +
		pgbscript.OneLine(c["pgImmediateSQL"]) + ";\n" + record + ";\n" +
		"COMMIT;\n" + pgbscript.OneLine(c["pgTxSessionSQL"]) + ";\n\\endpipeline\n"
	return claimPipe + writes + recordPipe
}

// txFold is a transactional script with its settings folded into the
// statements around them: the lock wait set by the bounds' SELECT
// (set_config), and the record's SET LOCALs (role, synchronous_commit,
// lock_timeout) in its restore SELECT: four statements fewer. set_config
// does not reach Citus's workers, so this is a measurement of what the
// statements cost, not a design Citus could run.
func txFold(script string) string {
	script = must(script, ", true) FROM (SELECT current_setting('role')", ", true), set_config('lock_timeout', '10ms', true) FROM (SELECT current_setting('role')")
	script = must(script, "SET LOCAL lock_timeout = '10ms';\n", "")
	script = must(script, ", set_config('idle_in_transaction_session_timeout', '30000ms', true);\nSET LOCAL ROLE NONE;\nSET LOCAL synchronous_commit = 'on';\nSET LOCAL lock_timeout = '0';\n",
		", set_config('idle_in_transaction_session_timeout', '30000ms', true), set_config('role', 'none', true), set_config('synchronous_commit', 'on', true), set_config('lock_timeout', '0', true);\n")
	return script
}

// lookupClaim is pgClaimSQL shaped as a plain lookup first: the read of
// the key's row, then the INSERT only when the read found none, so that a
// replay never runs the speculative insertion.
func lookupClaim(c map[string]string) string {
	cols := c["pgClaimStoredColumns"]
	return `WITH old AS (
	SELECT ` + cols + `, (status = 'in_flight' AND locked_until >= now() AND owner_token = $7::uuid) IS TRUE AS won
	FROM idempotency_keys WHERE idem_key = $1 AND scope_user_id = $2 AND scope_endpoint = $3
), ins AS (
	INSERT INTO idempotency_keys
		(idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
		 created_at, locked_at, locked_until, expires_at, owner_token)
	SELECT $1::text, $2::text, $3::text, $4::bytea, 'in_flight', 1,
		now(), now(), now() + $6::interval, now() + $5::interval, $7::uuid
	WHERE NOT EXISTS (SELECT 1 FROM old)
	ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
	RETURNING ` + cols + `
)
SELECT ` + cols + `, ` + c["pgFlags"] + `, true AS won FROM ins
UNION ALL
SELECT ` + cols + `, ` + c["pgFlags"] + `, won FROM old`
}

// The narrow table: the key, a bytea hash, the status, the response as
// bytes and the expiry; its primary key the only index.
const narrowSchema = `CREATE TABLE idempotency_keys (
    idem_key       TEXT        NOT NULL,
    scope_user_id  TEXT        NOT NULL,
    scope_endpoint TEXT        NOT NULL,
    request_hash   BYTEA       NOT NULL,
    status         TEXT        NOT NULL,
    response_code  SMALLINT,
    response_body  BYTEA,
    expires_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (scope_user_id, idem_key, scope_endpoint)
);
`

const narrowClaim = `INSERT INTO idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status, expires_at) ` +
	`VALUES (:key, :scope, :endpoint, :hash, 'in_flight', now() + :ttl::interval) ` +
	`ON CONFLICT (scope_user_id, idem_key, scope_endpoint) DO NOTHING RETURNING status`

const narrowComplete = `UPDATE idempotency_keys SET status = 'completed', response_code = :code, response_body = :body ` +
	`WHERE scope_user_id = :scope AND idem_key = :key AND scope_endpoint = :endpoint AND status = 'in_flight'`
