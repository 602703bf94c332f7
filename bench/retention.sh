#!/usr/bin/env bash
# Retention benchmark (issue #36, settled item 22); `make bench/retention` runs it.
#
#   bash bench/retention.sh                 50 million rows (the measurement's size)
#   ROWS=5000000 bash bench/retention.sh    a smaller table, on a busy or small machine
#
# In a database of its own (DB_NAME, dropped at the end unless KEEP_DB=1), made on DATABASE_URL's
# server, with this checkout's PostgreSQL migrations (migrations/*.up.sql, in order):
#   1. loads ROWS rows whose expires_at spread evenly over 30 days (generate_series), the first
#      BACKLOG_HOURS of them already expired (1/720 of the rows per simulated hour); every
#      TOMB_EVERY-th row is an ExpiredRefuse row (retain_until = expires_at + 1 day, a tombstone
#      once expired), the rest ExpiredRunAgain (retain_until = expires_at); each a completed key
#      with the example's order response (about 200 bytes of JSON body and 70 of headers);
#   2. reports the table's and each index's size, per million rows;
#   3. runs `idempotency cleanup` (cmd/idempotency, the store's Cleanup, batches of BATCH rows)
#      over the expired backlog while pgbench inserts new completed keys at RATE a second (one
#      INSERT per key: the claim and its record in one statement), and reports the rows deleted and
#      purged, the time per batch and the rows per second, and whether cleanup keeps up (it deletes
#      faster than keys are inserted);
#   4. prints the plans of cleanup's two batch reads (EXPLAIN), which must use idx_idem_keys_retain
#      and idx_idem_keys_purge;
#   5. computes (never measures) the 30-day table at RATE: RATE x 86400 x 30 rows at the measured
#      bytes per row.
# RATE defaults to the load tool's measured new-key rate (BENCHMARKS.md "Latest figures", A: the
# example server, a new key per request, 16 clients: 2228 req/s).
set -euo pipefail

cd "$(dirname "$0")/.."
ROWS=${ROWS:-50000000}
CHUNK=${CHUNK:-1000000}
BACKLOG_HOURS=${BACKLOG_HOURS:-24}
TOMB_EVERY=${TOMB_EVERY:-10}
RATE=${RATE:-2228}
BATCH=${BATCH:-1000}
CLIENTS=${CLIENTS:-4}
DB_NAME=${DB_NAME:-idem_retention}
BASE_DSN=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
LOG="$OUT/retention.log"
: >"$LOG"

say() { echo "== $*" | tee -a "$LOG"; }
# dsn_for DB: BASE_DSN naming database DB.
dsn_for() { sed -E "s#^(postgres(ql)?://[^/]*/)[^?]*#\1$1#" <<<"$BASE_DSN"; }
DSN=$(dsn_for "$DB_NAME")
q() { psql "$DSN" -X -q -v ON_ERROR_STOP=1 "$@"; }
qa() { psql "$DSN" -X -At -v ON_ERROR_STOP=1 "$@"; }

tmp=$(mktemp -d)
pgbench_pid=
finish() {
  [[ -n $pgbench_pid ]] && kill "$pgbench_pid" 2>/dev/null || true
  if [[ ${KEEP_DB:-0} != 1 ]]; then
    psql "$BASE_DSN" -X -q -c "DROP DATABASE IF EXISTS $DB_NAME" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap finish EXIT

say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $(psql "$BASE_DSN" -X -At -c 'SHOW server_version')"
say "rows $ROWS, backlog ${BACKLOG_HOURS}h expired, every ${TOMB_EVERY}th an ExpiredRefuse row, insert rate $RATE/s, batch $BATCH"
psql "$BASE_DSN" -X -q -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $DB_NAME" -c "CREATE DATABASE $DB_NAME"
for f in migrations/0*.up.sql; do q -f "$f"; done

# Loaded without indexes, which are then built with the migrations' own statements: a 50-million-row
# load through five B-trees takes hours on two cores. (The sizes are those of freshly built indexes.)
q -c "ALTER TABLE idempotency_keys DROP CONSTRAINT uq_idem_key_user_endpoint" \
  -c "DROP INDEX idx_idem_keys_expires, idx_idem_keys_retain, idx_idem_keys_purge"
body='{"id":123456,"symbol":"AAPL","side":"buy","qty":10,"type":"limit","limit_price":187.25,"status":"filled","fill_price":187.25,"filled_at":"2026-12-06T10:00:00Z","account":"acc-42"}'
headers='{"Content-Type":["application/json"],"Location":["/api/trading/orders/123456"]}'
start=$(date +%s)
for ((lo = 1; lo <= ROWS; lo += CHUNK)); do
  hi=$((lo + CHUNK - 1 < ROWS ? lo + CHUNK - 1 : ROWS))
  q -c "INSERT INTO idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
      response_code, response_body, response_headers, created_at, locked_at, locked_until, expires_at, retain_until)
    SELECT gen_random_uuid()::text, 'user-' || (i % 100000), 'POST /api/trading/orders',
      decode(md5(i::text) || md5((i + 1)::text), 'hex'), 'completed', 1, 201,
      convert_to('$body', 'UTF8'), convert_to('$headers', 'UTF8'),
      e - interval '30 days', e - interval '30 days', e - interval '30 days', e,
      CASE WHEN i % $TOMB_EVERY = 0 THEN e + interval '1 day' ELSE e END
    FROM generate_series($lo, $hi) AS i,
      LATERAL (SELECT now() - interval '$BACKLOG_HOURS hours' + (i - 1) * interval '30 days' / $ROWS AS e) AS t"
  echo "loaded $hi rows ($(($(date +%s) - start))s)" >>"$LOG"
done
say "loaded $ROWS rows in $(($(date +%s) - start))s; building the indexes"
start=$(date +%s)
q -c "ALTER TABLE idempotency_keys ADD CONSTRAINT uq_idem_key_user_endpoint PRIMARY KEY (scope_user_id, idem_key, scope_endpoint)" \
  -c "CREATE INDEX idx_idem_keys_expires ON idempotency_keys (expires_at)"
q -f migrations/000004_round4_retain_index.up.sql
q -f migrations/000005_round4_purge_index.up.sql
q -c "VACUUM ANALYZE idempotency_keys"
say "indexes built and table vacuumed in $(($(date +%s) - start))s"

say "sizes (bytes, and MiB per million rows)"
qa -F ' ' -c "SELECT name, bytes, round(bytes / 1048576.0 / ($ROWS / 1e6), 1) FROM (
    SELECT 'table (heap + TOAST)' AS name, pg_table_size('idempotency_keys') AS bytes, 0 AS o
    UNION ALL SELECT indexrelid::regclass::text, pg_relation_size(indexrelid), 1 FROM pg_index WHERE indrelid = 'idempotency_keys'::regclass
    UNION ALL SELECT 'total', pg_total_relation_size('idempotency_keys'), 2) s ORDER BY o, name" | tee -a "$LOG"
total=$(qa -c "SELECT pg_total_relation_size('idempotency_keys')")

say "plans of cleanup's batch reads (pgsql.ExpiredBatchSQL, pgsql.PurgeBatchSQL)"
q -c "EXPLAIN SELECT scope_user_id, idem_key, scope_endpoint FROM idempotency_keys
  WHERE retain_until < now() AND expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())
  ORDER BY retain_until LIMIT $BATCH" | tee -a "$LOG"
q -c "EXPLAIN SELECT scope_user_id, idem_key, scope_endpoint FROM idempotency_keys
  WHERE expires_at < now() AND retain_until > expires_at AND NOT purged
	AND status <> 'in_flight'
  ORDER BY expires_at LIMIT $BATCH" | tee -a "$LOG"

backlog=$(qa -c "SELECT count(*) FILTER (WHERE retain_until < now()), count(*) FILTER (WHERE expires_at < now() AND retain_until > expires_at AND NOT purged) FROM idempotency_keys")
say "backlog: $backlog (rows past retain_until | tombstones to purge)"

go build -o "$tmp/idempotency" ./cmd/idempotency
cat >"$tmp/insert.sql" <<SQL
\set uid random(1, 100000)
INSERT INTO idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
  response_code, response_body, response_headers, created_at, locked_at, locked_until, expires_at, retain_until)
VALUES (gen_random_uuid()::text, 'user-' || :uid, 'POST /api/trading/orders',
  decode(md5(random()::text) || md5(random()::text), 'hex'), 'completed', 1, 201,
  convert_to('$body', 'UTF8'), convert_to('$headers', 'UTF8'),
  now(), now(), now(), now() + interval '30 days', now() + interval '30 days');
SQL
t0=$(qa -c "SELECT now()")
pgbench "$DSN" -n -f "$tmp/insert.sql" -c "$CLIENTS" -j 2 -R "$RATE" -T 3600 >"$tmp/pgbench.out" 2>&1 &
pgbench_pid=$!
sleep 5 # pgbench at its rate before cleanup starts
start_ns=$(date +%s%N)
DATABASE_URL=$DSN "$tmp/idempotency" cleanup --batch "$BATCH" --json --progress 0 >"$tmp/cleanup.json"
elapsed_ns=$(($(date +%s%N) - start_ns))
sleep 2
kill -TERM "$pgbench_pid" 2>/dev/null || true
wait "$pgbench_pid" 2>/dev/null || true
pgbench_pid=
t1=$(qa -c "SELECT now()")
say "cleanup while pgbench inserts: $(cat "$tmp/cleanup.json")"
left=$(qa -c "SELECT count(*) FILTER (WHERE retain_until < now() AND expires_at < now()), count(*) FILTER (WHERE expires_at < now() AND retain_until > expires_at AND response_body IS NOT NULL) FROM idempotency_keys")
say "left after cleanup: $left (rows past retain_until | tombstones with a body)"
tps=$(qa -c "SELECT round(count(*) / extract(epoch FROM timestamptz '$t1' - timestamptz '$t0')) FROM idempotency_keys WHERE created_at > '$t0'")
say "insert rate achieved by pgbench over its window: $tps/s (target $RATE/s, $CLIENTS clients)"
changed=$(tr -d ' \n' <"$tmp/cleanup.json" | sed -E 's/.*"deleted":([0-9]+).*/\1/')
batches=$(tr -d ' \n' <"$tmp/cleanup.json" | sed -E 's/.*"batches":([0-9]+).*/\1/')
awk -v n="$changed" -v b="$batches" -v ns="$elapsed_ns" -v rate="${tps:-$RATE}" 'BEGIN {
  s = ns / 1e9
  printf "cleanup: %d rows changed (deleted + purged) in %.2f s, %d batches: %.1f ms per batch, %.0f rows/s; insert rate %.0f/s: cleanup %s\n",
    n, s, b, 1000 * s / b, n / s, rate, (n / s > rate ? "keeps up" : "does NOT keep up")
}' | tee -a "$LOG"
awk -v rows="$ROWS" -v total="$total" -v rate="$RATE" 'BEGIN {
  per = total / rows; n = rate * 86400 * 30
  printf "30 days at %d new keys/s (a computation, not a measured table): %d x 86400 x 30 = %.3g rows x %.0f bytes/row (measured above, indexes included) = %.2f TiB\n",
    rate, rate, n, per, n * per / 1024^4
}' | tee -a "$LOG"
