#!/usr/bin/env bash
# The storage ablation (issue #27; make bench/ablation): every candidate
# schema change of bench/cmd/ablation in ONE run, interleaved (each rep
# runs every candidate once, in turn), REPS reps, each run twice: as
# deployed (synchronous_commit on: every commit waits for its WAL flush)
# and with synchronous_commit=off for the pgbench session, which takes the
# flush out and leaves each statement's own cost. Prints one Markdown
# table of medians (tps), with the spread of the reps.
#
#   DATABASE_URL  the database (default: the local test database)
#   BEFORE        the revision whose statements and schema are "before" (default: the schema before #27)
#   REPS T CLIENTS  reps (3), seconds a run (8), pgbench clients (16)
#   ONLY          a space-separated list of candidates to run (default: all)
#
# Each candidate works in a schema of its own (abl_NAME), created afresh
# and TRUNCATEd before each run, and dropped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
DB=${DATABASE_URL:-${IDEMPOTENCY_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}}
BEFORE=${BEFORE:-aa2d4de}
REPS=${REPS:-3} T=${T:-8} CLIENTS=${CLIENTS:-16}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

mkdir -p "$OUT/before/migrations" "$OUT/gen"
for f in store_pg_sql.go store_pg_tx_sql.go migrations/000001_create_idempotency_keys.up.sql; do
  git show "$BEFORE:$f" >"$OUT/before/$f"
done
(cd bench && go run ./cmd/ablation -before "$OUT/before" -after .. -out "$OUT/gen")
mapfile -t cands <"$OUT/gen/candidates"
if [[ -n ${ONLY:-} ]]; then read -ra cands <<<"$ONLY"; fi

psql_q() { psql "$DB" -X -q -v ON_ERROR_STOP=1 "$@"; }
for c in "${cands[@]}"; do
  psql_q -c "DROP SCHEMA IF EXISTS abl_$c CASCADE" -c "CREATE SCHEMA abl_$c" 2>/dev/null
  PGOPTIONS="-c search_path=abl_$c" psql_q -f "$OUT/gen/$c.schema.sql"
done
cleanup() {
  for c in "${cands[@]}"; do psql_q -c "DROP SCHEMA IF EXISTS abl_$c CASCADE" 2>/dev/null || true; done
  rm -rf "$OUT"
}
trap cleanup EXIT

vars_of() { local v; vars=(); while IFS= read -r v; do [[ -n $v ]] && vars+=(-D "$v"); done <"$OUT/gen/$1.vars"; }

# one CAND SYNC: prints the tps of one run.
one() {
  local c=$1 sync=$2 out tables
  vars_of "$c"
  tables=$(psql "$DB" -X -A -t -c "SELECT string_agg(quote_ident(tablename), ',') FROM pg_tables WHERE schemaname = 'abl_$c'")
  psql_q -c "TRUNCATE $(sed "s/\([^,]*\)/abl_$c.\1/g" <<<"$tables")" -c "CHECKPOINT" >/dev/null
  if [[ -s $OUT/gen/$c.setup.sql ]]; then
    (cd "$OUT/gen" && PGOPTIONS="-c search_path=abl_$c" pgbench -n -M prepared "${vars[@]}" -f "$c.setup.sql" -c 1 -t 1 "$DB" >/dev/null)
  fi
  # The transactional scripts put the session's synchronous_commit back
  # before the record, as the store does: the session's value here.
  sed "s/SET LOCAL synchronous_commit = 'on'/SET LOCAL synchronous_commit = '$sync'/" "$OUT/gen/$c.sql" >"$OUT/gen/$c.$sync.run.sql"
  out=$(cd "$OUT/gen" && PGOPTIONS="-c search_path=abl_$c -c synchronous_commit=$sync" \
    pgbench -n -M prepared "${vars[@]}" -f "$c.$sync.run.sql" -c "$CLIENTS" -j 2 -T "$T" "$DB" 2>&1) || {
    echo "pgbench $c $sync failed: $(tail -n 3 <<<"$out")" >&2
    echo 0
    return
  }
  sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out"
}

declare -A res
echo "ablation: ${#cands[@]} candidates x {on,off} x $REPS reps, ${T}s each, $CLIENTS clients; before = $BEFORE ($(git rev-parse --short "$BEFORE")), after = $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')" >&2
for r in $(seq 1 "$REPS"); do
  for c in "${cands[@]}"; do
    for s in on off; do
      t=$(one "$c" "$s")
      res[$c,$s]+="$t "
      echo "rep $r $c sync=$s: $t tps" >&2
    done
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
echo
echo "| candidate | tps, synchronous_commit on (median) | reps | tps, synchronous_commit off (median) | reps |"
echo "|---|---:|---|---:|---|"
for c in "${cands[@]}"; do
  on=$(median <<<"${res[$c,on]}") off=$(median <<<"${res[$c,off]}")
  printf '| %s | %.0f | %s | %.0f | %s |\n' "$c" "$on" "$(xargs printf '%.0f ' <<<"${res[$c,on]}")" "$off" "$(xargs printf '%.0f ' <<<"${res[$c,off]}")"
done
