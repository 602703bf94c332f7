// Command pgbenchsql writes pgbench scripts that run the library's own claim
// and complete statements, read from the pgClaimSQL and pgCompleteSQL
// constants of internal/pgsql (so the scripts follow the library's SQL), with
// their $n parameters turned into pgbench variables. Run the scripts with
// pgbench -M prepared, which sends the variables as parameters, and these
// -D variables: scope, endpoint, hash, ttl, lease, owner (a UUID), code
// (the status), body, headers (and hotkey for the hot scripts).
//
//	miss.sql       claim a new random key, then complete it (\gset reads id and attempt)
//	hot_setup.sql  claim and complete :hotkey (run once, one client)
//	hot.sql        claim :hotkey again: a replay's store work
//
// miss.sql is exactly what an ordinary route's new key runs (pgClaimSQL,
// then pgCompleteSQL, each alone), and hot.sql what its replay runs
// (pgClaimSQL of a completed key); bench/cmd/noopserver's test traces the
// route's statements to hold them to that.
//
// and, from the example server's postgres.go (-example), the SQL of subjects
// A and B without HTTP or Go:
//
//	example_schema.sql  the example's tables (schemaSQL)
//	order.sql           B's transaction: BEGIN, the order's two writes, COMMIT
//	order_idem.sql      the two-commit design: the claim, then BEGIN, the
//	                    same writes, the fenced complete, COMMIT
//	order_idem_tx.sql   A's one-transaction design with BEGIN and COMMIT
//	                    alone: the session's state read with the bounds, the
//	                    lock wait, the claim, the SAVEPOINT and the session's
//	                    lock_timeout back in one pipeline; the writes; the
//	                    claim's state put back, SET CONSTRAINTS ALL IMMEDIATE
//	                    and the complete in one pipeline
//	order_idem_tx_all.sql the same with BEGIN and COMMIT (and the session's
//	                    state read after it) in the pipelines: what the
//	                    middleware sends
//
// The transactional statements are in internal/pgsql too;
// the SET LOCAL statements are built as the store's
// pgSetLocal builds them, for a session with the default settings.
//
// In the pipelined scripts the complete finds the claim's row by its key
// (pgbench allows no \gset in a pipeline); the middleware fences it on
// the id and attempt the claim returned.
//
// With -summarize it reads the per-transaction logs of a pgbench -l run
// instead and prints the SUMMARY line the other bench tools print.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency/bench/internal/gosrc"
	"github.com/idemkit/idempotency/bench/internal/pgbscript"
	"github.com/idemkit/idempotency/bench/internal/result"
)

// summarizeLogs reads pgbench's per-transaction logs (client, transaction,
// latency in microseconds, ...) and prints a SUMMARY line.
func summarizeLogs(dir, mode string, clients int, tps float64, failed int64) error {
	paths, err := filepath.Glob(filepath.Join(dir, "pgbench_log.*"))
	if err != nil || len(paths) == 0 {
		return fmt.Errorf("no pgbench_log.* files in %s", dir)
	}
	var lat result.Latencies
	var first, last float64
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) < 6 {
				continue
			}
			us, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				continue // "failed" or "skipped" in place of a latency
			}
			lat = append(lat, time.Duration(us)*time.Microsecond)
			sec, _ := strconv.ParseFloat(f[4], 64)
			usec, _ := strconv.ParseFloat(f[5], 64)
			at := sec + usec/1e6
			if first == 0 || at < first {
				first = at
			}
			last = max(last, at)
		}
	}
	s := result.Summary{Tool: "pgbench", Subject: "P", Mode: mode, Concurrency: clients,
		Requests: int64(len(lat)), RPS: tps, DurationS: last - first, Errors: failed}
	if s.RPS == 0 && s.DurationS > 0 {
		s.RPS = float64(s.Requests) / s.DurationS
	}
	lat.Fill(&s)
	fmt.Printf("P pgbench %s: %d clients, %d transactions: %.0f tps\n", mode, clients, s.Requests, s.RPS)
	fmt.Printf("  latency p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms\n", s.P50Ms, s.P90Ms, s.P99Ms, s.MaxMs)
	s.Print(os.Stdout)
	return nil
}

func main() {
	src := flag.String("src", ".", "the library's repository (its internal/pgsql holds the statements)")
	example := flag.String("example", "examples/server/postgres.go", "the example server's postgres.go")
	out := flag.String("out", ".", "directory to write the scripts into")
	summarize := flag.Bool("summarize", false, "summarize pgbench -l logs instead of writing scripts")
	logs := flag.String("logs", ".", "-summarize: directory holding the pgbench_log.* files")
	mode := flag.String("mode", "unique", "-summarize: mode label")
	clients := flag.Int("concurrency", 16, "-summarize: pgbench -c")
	tps := flag.Float64("tps", 0, "-summarize: the tps pgbench reported (without connection time)")
	failed := flag.Int64("failed", 0, "-summarize: failed transactions pgbench reported")
	flag.Parse()
	if *summarize {
		if err := summarizeLogs(*logs, *mode, *clients, *tps, *failed); err != nil {
			fmt.Fprintln(os.Stderr, "pgbenchsql:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*src, *example, *out); err != nil {
		fmt.Fprintln(os.Stderr, "pgbenchsql:", err)
		os.Exit(1)
	}
}

func run(src, example, out string) error {
	consts, err := gosrc.PostgresStatements(src)
	if err != nil {
		return err
	}
	claim, complete := consts["pgClaimSQL"], consts["pgCompleteSQL"]
	if claim == "" || complete == "" {
		return fmt.Errorf("%s: pgClaimSQL or pgCompleteSQL not found", src)
	}
	ex, err := gosrc.StringConsts(example)
	if err != nil {
		return err
	}
	schema, insOrder, insPlaced := ex["schemaSQL"], ex["insertOrderSQL"], ex["insertOrderPlacedSQL"]
	if schema == "" || insOrder == "" || insPlaced == "" {
		return fmt.Errorf("%s: schemaSQL, insertOrderSQL or insertOrderPlacedSQL not found", example)
	}
	var tx [7]string
	for i, name := range []string{"pgTxBoundsSQL", "pgTxClaimSQL", "pgSavepointSQL", "pgTxRestoreSQL", "pgImmediateSQL", "pgTxCompleteSQL", "pgTxSessionSQL"} {
		if tx[i] = consts[name]; tx[i] == "" {
			return fmt.Errorf("%s: the transactional statement %s not found", src, name)
		}
	}
	bounds, txClaim, savepoint, restore, immediate, txComplete, session := tx[0], tx[1], tx[2], tx[3], tx[4], tx[5], tx[6]
	// As the middleware sends them: every claim carries an owner token (a
	// new one per request; one fixed token here, which no row's status
	// lets match), and the complete the status as a parameter. The raw
	// body is NULL for a JSON body: a literal, since a pgbench variable
	// cannot be NULL.
	claimArgs := []string{":key", ":scope", ":endpoint", ":hash", ":ttl", ":lease", ":owner", "''", "'0'"}
	completeArgs := []string{":c_id", ":c_attempt", ":scope", ":code", ":body", "NULL", ":headers", "NULL", ":key", ":endpoint"}
	claimWith := func(key string) string {
		args := append([]string{key}, claimArgs[1:]...)
		return pgbscript.OneLine(pgbscript.Bind(claim, args))
	}
	completeSQL := pgbscript.OneLine(pgbscript.Bind(complete, completeArgs))
	hotCompleteSQL := pgbscript.OneLine(pgbscript.Bind(complete, append(completeArgs[:8:8], ":hotkey", ":endpoint")))
	// The order's writes with the values the load generator sends; the
	// audit context is the size of the example's.
	orderWrites := pgbscript.OneLine(pgbscript.Bind(insOrder, []string{"1", "'AAPL'", "'buy'", "1", "'filled'", "187.43", ":key"})) + ";\n" +
		pgbscript.OneLine(pgbscript.Bind(insPlaced, []string{"1", `'{"order_id":1,"symbol":"AAPL","side":"buy","qty":1,"client_order_id":"0b6f3c1e-9a2d-4e7f-8c5b-3d1a2e4f6a8b"}'`})) + ";\n"
	newKey := "\\set key random(1, 9223372036854775806)\n"
	// The one-transaction flow: the claim's pipeline and the record's.
	// The claim reads the session's state with its bounds (the lease as
	// text), waits under SET LOCAL lock_timeout and puts the session's
	// back; the record puts the claim's state back first.
	claimPipe := pgbscript.OneLine(pgbscript.Bind(bounds, []string{"'30000ms'"})) + ";\n" +
		"SET LOCAL lock_timeout = '10ms';\n" +
		pgbscript.OneLine(pgbscript.Bind(txClaim, claimArgs)) + ";\n" + pgbscript.OneLine(savepoint) + ";\n" +
		"SET LOCAL lock_timeout = '0';\n"
	byKey := "(SELECT id FROM idempotency_keys WHERE idem_key = :key::text AND scope_user_id = :scope AND scope_endpoint = :endpoint)"
	recordPipe := pgbscript.OneLine(pgbscript.Bind(restore, []string{"'30000ms'", "current_setting('search_path')", "'30000ms'"})) + ";\n" +
		"SET LOCAL ROLE NONE;\nSET LOCAL synchronous_commit = 'on';\nSET LOCAL lock_timeout = '0';\n" +
		pgbscript.OneLine(immediate) + ";\n" + pgbscript.OneLine(pgbscript.Bind(txComplete, []string{byKey, "1", ":scope", ":code", ":body", "NULL", ":headers", "NULL", ":key::text", ":endpoint"})) + ";\n"
	files := map[string]string{
		"example_schema.sql": schema,
		"order.sql":          newKey + "BEGIN;\n" + orderWrites + "COMMIT;\n",
		"order_idem.sql": newKey + claimWith(":key") + "\n\\gset c_\n" +
			"BEGIN;\n" + orderWrites + completeSQL + ";\nCOMMIT;\n",
		"order_idem_tx.sql": newKey + "BEGIN;\n\\startpipeline\n" + claimPipe + "\\endpipeline\n" + orderWrites +
			"\\startpipeline\n" + recordPipe + "\\endpipeline\nCOMMIT;\n",
		"order_idem_tx_all.sql": newKey + "\\startpipeline\nBEGIN;\n" + claimPipe + "\\endpipeline\n" + orderWrites +
			"\\startpipeline\n" + recordPipe + "COMMIT;\n" + pgbscript.OneLine(session) + ";\n\\endpipeline\n",
		"miss.sql": "\\set key random(1, 9223372036854775806)\n" +
			claimWith(":key") + "\n\\gset c_\n" + completeSQL + ";\n",
		"hot_setup.sql": claimWith(":hotkey") + "\n\\gset c_\n" + hotCompleteSQL + ";\n",
		"hot.sql":       claimWith(":hotkey") + ";\n",
	}
	for name, body := range files {
		header := "-- Generated by bench/cmd/pgbenchsql from " + filepath.Base(src) + " and " + filepath.Base(example) + "; do not edit.\n"
		if err := os.WriteFile(filepath.Join(out, name), []byte(header+body), 0o644); err != nil {
			return err
		}
	}
	return nil
}
