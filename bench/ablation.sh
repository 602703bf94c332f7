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

mkdir -p "$OUT/before/migrations" "$OUT/before/internal/pgsql" "$OUT/gen"
for f in store_pg_sql.go store_pg_tx_sql.go internal/pgsql/pgsql.go migrations/000001_create_idempotency_keys.up.sql; do
  git show "$BEFORE:$f" >"$OUT/before/$f" 2>/dev/null || rm -f "$OUT/before/$f"
done
(cd bench && go run ./cmd/ablation -before "$OUT/before" -after .. -out "$OUT/gen")
mapfile -t cands <"$OUT/gen/candidates"
if [[ -n ${ONLY:-} ]]; then read -ra cands <<<"$ONLY"; fi

# psql itself, past Debian's version-picking wrapper (a Perl start-up per
# call, which this script makes hundreds of).
PSQL=$(command -v "$(pg_config --bindir 2>/dev/null)/psql" || command -v psql)
# psql_q runs psql, again after a second when it failed (up to 10 times:
# other work on a shared database may hold every connection slot).
psql_q() {
  local i
  for i in $(seq 1 10); do
    "$PSQL" "$DB" -X -q -v ON_ERROR_STOP=1 "$@" && return 0
    sleep 1
  done
  return 1
}
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

# cpu_of PIDS...: the CPU time (user + system, in clock ticks) the
# processes have used so far; a process gone counts 0.
cpu_of() {
  local p f t=0
  for p in "$@"; do
    if read -ra f 2>/dev/null <"/proc/$p/stat"; then t=$((t + f[13] + f[14])); fi
  done
  echo "$t"
}

# one CAND SYNC: one_try, again (up to 3 times) when pgbench could not
# connect all its clients (the shared database's slots were taken).
one() {
  local r i
  for i in 1 2 3; do
    r=$(one_try "$@")
    [[ $r != "0 0" ]] && break
    sleep 2
  done
  echo "$r"
}

# one_try CAND SYNC: prints "TPS CPU" for one run: pgbench's tps, and the CPU
# its backends used per transaction (microseconds; sampled from /proc every
# 0.2 s while they run, so up to 0.2 s of each backend's last work is
# missed). CPU per transaction hardly depends on what else the machine
# runs; tps does.
one_try() {
  local c=$1 sync=$2 out tables app=abl_$1_$2 pid pids last=() i tps n cpu tick
  vars_of "$c"
  psql_q -c "DO \$\$ BEGIN EXECUTE (SELECT 'TRUNCATE ' || string_agg(format('%I.%I', schemaname, tablename), ', ')
    FROM pg_tables WHERE schemaname = 'abl_$c'); END \$\$" >/dev/null
  if [[ -s $OUT/gen/$c.setup.sql ]]; then
    (cd "$OUT/gen" && PGOPTIONS="-c search_path=abl_$c" pgbench -n -M prepared "${vars[@]}" -f "$c.setup.sql" -c 1 -t 1 "$DB" >/dev/null)
  fi
  # The transactional scripts put the session's synchronous_commit back
  # before the record, as the store does: the session's value here.
  sed -e "s/SET LOCAL synchronous_commit = 'on'/SET LOCAL synchronous_commit = '$sync'/" -e "s/set_config('synchronous_commit', 'on', true)/set_config('synchronous_commit', '$sync', true)/" "$OUT/gen/$c.sql" >"$OUT/gen/$c.$sync.run.sql"
  (cd "$OUT/gen" && PGAPPNAME=$app PGOPTIONS="-c search_path=abl_$c -c synchronous_commit=$sync" \
    pgbench -n -M prepared "${vars[@]}" -f "$c.$sync.run.sql" -c "$CLIENTS" -j 2 -T "$T" "$DB" >"$OUT/pgbench.out" 2>&1) &
  pid=$!
  pids=()
  for _ in $(seq 1 50); do
    sleep 0.1
    mapfile -t pids < <("$PSQL" "$DB" -X -A -t -c "SELECT pid FROM pg_stat_activity WHERE application_name = '$app'" 2>/dev/null || true)
    ((${#pids[@]} >= CLIENTS)) && break
    kill -0 "$pid" 2>/dev/null || break
  done
  for i in "${!pids[@]}"; do last[i]=0; done
  while kill -0 "$pid" 2>/dev/null; do
    for i in "${!pids[@]}"; do
      tick=$(cpu_of "${pids[i]}")
      ((tick > 0)) && last[i]=$tick
    done
    sleep 0.2
  done
  wait "$pid" || {
    echo "pgbench $c $sync failed: $(grep -v "^pgbench: client .* receiving$" "$OUT/pgbench.out" | grep -m3 -i "error\|abort")" >&2
    echo "0 0"
    return
  }
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$OUT/pgbench.out")
  n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$OUT/pgbench.out")
  cpu=0
  for i in "${!pids[@]}"; do cpu=$((cpu + last[i])); done
  echo "$tps $(awk -v c="$cpu" -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN { if (n > 0) printf "%.0f", c / hz * 1e6 / n; else print 0 }')"
}

declare -A res cpu
echo "ablation: ${#cands[@]} candidates x {on,off} x $REPS reps, ${T}s each, $CLIENTS clients; before = $BEFORE ($(git rev-parse --short "$BEFORE")), after = $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty'); load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$REPS"); do
  for c in "${cands[@]}"; do
    for s in on off; do
      read -r t u < <(one "$c" "$s")
      res[$c,$s]+="$t " cpu[$c,$s]+="$u "
      echo "rep $r $c sync=$s: $t tps, $u us CPU/txn (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    done
  done
done

median() { tr ' ' '\n' | grep -v '^$' | grep -v '^0$' | sort -n | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
reps() { xargs printf '%.0f ' <<<"$1"; }
echo
echo "| candidate | tps, sync on | reps | tps, sync off | reps | backend CPU µs/txn, sync on | reps | backend CPU µs/txn, sync off | reps |"
echo "|---|---:|---|---:|---|---:|---|---:|---|"
for c in "${cands[@]}"; do
  printf '| %s | %.0f | %s | %.0f | %s | %.0f | %s | %.0f | %s |\n' "$c" \
    "$(median <<<"${res[$c,on]}")" "$(reps "${res[$c,on]}")" "$(median <<<"${res[$c,off]}")" "$(reps "${res[$c,off]}")" \
    "$(median <<<"${cpu[$c,on]}")" "$(reps "${cpu[$c,on]}")" "$(median <<<"${cpu[$c,off]}")" "$(reps "${cpu[$c,off]}")"
done
