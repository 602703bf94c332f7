#!/usr/bin/env bash
# The example server and the no-op server built from two git refs, measured
# side by side in one interleaved run; `make bench/beforeafter REFS="B A"`
# runs it.
#
#   bash bench/beforeafter.sh BEFORE_REF AFTER_REF
#   bash bench/beforeafter.sh "$(git rev-parse 0bedb4a^1)" main   # issue #23: the engine
#   bash bench/beforeafter.sh main r-perf                         # issue #27
#   DATABASE_URL='mysql://root@127.0.0.1:3306/test' SUBJECTS='A B' \
#     bash bench/beforeafter.sh main r-sqlstore                   # issue #25, once the
#                                                                 # example server takes mysql://
#
# Each ref is checked out with `git worktree add --detach` into a temporary
# directory, its examples/server and bench/cmd/noopserver are built (with
# GOWORK=off, each against its own ref's library), and the worktree is
# removed. The load generator (bench/cmd/loadgen) and the report
# (bench/cmd/pairreport) are this checkout's, the same for both refs.
#
# Subjects (SUBJECTS, default "A N"; "A B" or "A" for a database noopserver
# does not speak):
#   A  the example server's order route, middleware on, -order-latency 0:
#      a new Idempotency-Key per request, and one hot key replayed
#   B  the same route with FLAG_IDEMPOTENCY_MIDDLEWARE=0 (new keys only)
#   N  bench/cmd/noopserver's no-op route: new keys, and one hot key replayed
# every one of them once per ref, each server in a schema (or MySQL
# database) of its own, made afresh and migrated by that server at start-up
# with its own ref's migrations, so the refs' schemas may differ. All the
# servers run for the whole run. Blocks (REPS of them, default 5): each
# subject and mode runs once per ref, the two runs next to each other; the
# pairs' order rotates by one from block to block and which ref goes first
# alternates (bench/lib.sh pair_blocks). Each run: 16 clients, up to
# SETTLE (5s) waiting for the cores to calm down, WARM (1s) warm-up, DUR
# (5s) measured.
#
# Output: a Markdown table (bench/results/beforeafter/report.md, and
# stdout) to paste into BENCHMARKS.md: per subject and mode, the median
# req/s of each ref, the median of the blocks' after/before ratios (each
# pair listed), and CPU per request of the server process and of the
# database: for PostgreSQL the backends of that server's connections
# (application_name), summed from /proc at the window's ends; for MySQL the
# whole mysqld/mariadbd process, other work on it included. The machine's
# load average at the start and the end goes above the table.
#
# Environment: DATABASE_URL (default
# postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable; postgres:// or
# mysql://, on this machine only): the servers' database. The run works in
# the schemas (MySQL: databases) idem_ba_<subject>_before and _after,
# dropped at the end unless KEEP_SCHEMA=1. REPS, DUR, WARM, SETTLE,
# SUBJECTS as above. PROFILE=1 builds the example servers with net/http/pprof
# (bench/profile/pprof.go.in, as a full bench/load.sh run does) and, after the
# blocks, profiles A's new keys on each ref in PROFILE_ROUNDS (3) adjacent
# rounds whose order alternates: heap allocations per request (runtime
# Mallocs and TotalAlloc over a window of DUR) and a CPU profile of the
# server; bench/results/beforeafter/profile.md gets the merged `pprof -top`
# of each ref and their difference (after with before as the base,
# normalized to the same total). Exits non-zero, after printing what it
# has, when any run failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/lib.sh
root=$PWD
started=$SECONDS

case ${1:-} in
  -h | --help) sed -n '2,57p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
if (($# != 2)); then
  echo "usage: bash bench/beforeafter.sh BEFORE_REF AFTER_REF (see -h)" >&2
  exit 2
fi
declare -A ref commit
ref[before]=$1 ref[after]=$2
for v in before after; do
  commit[$v]=$(git rev-parse --verify --quiet "${ref[$v]}^{commit}") ||
    { echo "beforeafter.sh: ${ref[$v]}: not a commit" >&2; exit 2; }
done

REPS=${REPS:-5} DUR=${DUR:-5s} WARM=${WARM:-1s} SETTLE=${SETTLE:-5s}
BASE_DSN=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
case $BASE_DSN in
  postgres://* | postgresql://*) db=postgres db_label=PostgreSQL ;;
  mysql://*) db=mysql db_label="MySQL (whole server process)" ;;
  *) echo "beforeafter.sh: DATABASE_URL must be postgres:// or mysql://" >&2; exit 2 ;;
esac
SUBJECTS=${SUBJECTS:-A N}
PROFILE=${PROFILE:-0} PROFILE_ROUNDS=${PROFILE_ROUNDS:-3}
[[ $PROFILE == [01] ]] || { echo "beforeafter.sh: PROFILE must be 0 or 1" >&2; exit 2; }
[[ $PROFILE_ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "beforeafter.sh: PROFILE_ROUNDS must be a positive integer" >&2; exit 2; }
for s in $SUBJECTS; do
  [[ $s == [ABN] ]] || { echo "beforeafter.sh: unknown subject $s in SUBJECTS (want A, B, N)" >&2; exit 2; }
done
[[ $db == mysql && $SUBJECTS == *N* ]] &&
  { echo "beforeafter.sh: noopserver (N) runs on PostgreSQL only: set SUBJECTS='A B' or 'A'" >&2; exit 2; }
[[ $REPS =~ ^[1-9][0-9]*$ ]] || { echo "beforeafter.sh: REPS must be a positive integer" >&2; exit 2; }
((REPS >= 3)) || echo "beforeafter.sh: REPS=$REPS: fewer than 3 blocks, the medians are no figures to publish" >&2

OUT=bench/results/beforeafter
BIN=$OUT/bin
LOG=$OUT/run.log
rm -rf "$BIN" && mkdir -p "$BIN/before" "$BIN/after"
: >"$LOG"
for tool in go git curl; do
  command -v "$tool" >/dev/null || { echo "beforeafter.sh: $tool is required" >&2; exit 1; }
done
[[ $db == postgres ]] && { command -v psql >/dev/null || { echo "beforeafter.sh: psql is required" >&2; exit 1; }; }
[[ $db == mysql ]] && { command -v mysql >/dev/null || { echo "beforeafter.sh: the mysql client is required" >&2; exit 1; }; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/beforeafter.XXXXXX")
cleanup_more() {
  local d
  for d in "$tmp"/before "$tmp"/after; do
    [[ -d $d ]] && git worktree remove --force "$d" 2>/dev/null
  done
  rm -rf "$tmp"
  git worktree prune 2>/dev/null || true
  if [[ $db == mysql && ${KEEP_SCHEMA:-0} != 1 ]]; then
    for d in "${mysql_dbs[@]}"; do mysql_q -e "DROP DATABASE IF EXISTS \`$d\`" 2>/dev/null || true; done
  fi
}
mysql_dbs=()
trap cleanup EXIT
trap 'exit 130' INT TERM

say "building this checkout's loadgen and pairreport"
(cd bench && go build -o "$root/$BIN/" ./cmd/loadgen ./cmd/pairreport ./cmd/sqlfloor)

# The database, one schema (database) per server, and how to find its
# processes.
if [[ $db == postgres ]]; then
  "$BIN/sqlfloor" -check -database-url "$BASE_DSN" # refuses a database off this machine
  # server_dsn NAME: NAME's schema, made afresh; DSN and DB_CMD set.
  server_dsn() {
    reset_schema "$1"
    DSN=$(with_schema "$BASE_DSN" "$1" "$1")
    DB_CMD=$(db_pids_cmd "$1")
  }
else
  re='^mysql://(([^:@/]*)(:([^@/]*))?@)?([^:/?]+)(:([0-9]+))?(/[^?]*)?(\?.*)?$'
  [[ $BASE_DSN =~ $re ]] || { echo "beforeafter.sh: cannot read DATABASE_URL as mysql://user:pass@host:port/db" >&2; exit 2; }
  my_user=${BASH_REMATCH[2]:-root} my_pass=${BASH_REMATCH[4]} my_host=${BASH_REMATCH[5]}
  my_port=${BASH_REMATCH[7]:-3306} my_query=${BASH_REMATCH[9]} my_auth=${BASH_REMATCH[1]}
  case $my_host in
    127.0.0.1 | localhost | ::1 | '[::1]') ;;
    *) echo "beforeafter.sh: DATABASE_URL's host $my_host is not this machine (loopback only)" >&2; exit 2 ;;
  esac
  mysql_q() { MYSQL_PWD=$my_pass mysql -h "$my_host" -P "$my_port" -u "$my_user" "$@"; }
  mysql_q -e 'SELECT 1' >/dev/null || { echo "beforeafter.sh: cannot reach the MySQL server of DATABASE_URL" >&2; exit 1; }
  server_dsn() {
    mysql_q -e "DROP DATABASE IF EXISTS \`$1\`; CREATE DATABASE \`$1\`"
    mysql_dbs+=("$1")
    DSN="mysql://$my_auth$my_host:$my_port/$1$my_query"
    DB_CMD='pgrep -x mariadbd || pgrep -x mysqld'
  }
fi

for v in before after; do
  say "building $v = ${ref[$v]} (${commit[$v]:0:12}): examples/server and bench/cmd/noopserver"
  git worktree add --detach --quiet "$tmp/$v" "${commit[$v]}"
  overlay=()
  if ((PROFILE)); then
    printf '{"Replace":{"%s":"%s"}}\n' "$tmp/$v/examples/server/zz_bench_pprof.go" "$root/bench/profile/pprof.go.in" >"$tmp/$v.overlay.json"
    overlay=(-overlay "$tmp/$v.overlay.json")
  fi
  (cd "$tmp/$v" && GOWORK=off go build "${overlay[@]}" -o "$root/$BIN/$v/server" ./examples/server)
  if [[ $SUBJECTS == *N* ]]; then
    [[ -d $tmp/$v/bench/cmd/noopserver ]] ||
      { echo "beforeafter.sh: ${ref[$v]} has no bench/cmd/noopserver: set SUBJECTS without N" >&2; exit 1; }
    (cd "$tmp/$v/bench" && GOWORK=off go build -o "$root/$BIN/$v/noopserver" ./cmd/noopserver)
  fi
  git worktree remove --force "$tmp/$v"
done

declare -A pprof_port
load_start=$(load_now)
run_date=$(date -u '+%Y-%m-%d %H:%M UTC')
points=()
for s in $SUBJECTS; do
  case $s in
    A) points+=(A:unique A:hot) ;;
    B) points+=(B:unique) ;;
    N) points+=(N:unique N:hot) ;;
  esac
  for v in before after; do
    name="idem_ba_${s,,}_$v"
    server_dsn "$name"
    pprof_env=()
    if ((PROFILE)) && [[ $s == A ]]; then
      pprof_port[$v]=$(free_port)
      pprof_env=(BENCH_PPROF_ADDR="127.0.0.1:${pprof_port[$v]}")
    fi
    case $s in
      A) SERVER_BIN=$BIN/$v/server start_server "A-$v" "$DSN" "${pprof_env[@]}" ;;
      B) SERVER_BIN=$BIN/$v/server start_server "B-$v" "$DSN" FLAG_IDEMPOTENCY_MIDDLEWARE=0 ;;
      N) NOOP_BIN=$BIN/$v/noopserver start_noop "N-$v" "$DSN" ;;
    esac
    pair_register "$s/$v" "$DB_CMD"
  done
done

say "before = ${ref[before]} (${commit[before]:0:12}), after = ${ref[after]} (${commit[after]:0:12}): ${points[*]}, $REPS blocks, 16 clients, $DUR each after a $WARM warm-up"
pair_blocks "$REPS" before after "${points[@]}"

# profile_round VARIANT ROUND: A's new keys on VARIANT for DUR at 16 clients,
# with the server's heap allocations over the window and a CPU profile of
# its middle.
# memstat VARIANT: the server's runtime Mallocs and TotalAlloc, one read.
memstat() { curl -sf "http://127.0.0.1:${pprof_port[$1]}/debug/pprof/heap?debug=1" | awk '$2 == "Mallocs" { m = $4 } $2 == "TotalAlloc" { b = $4 } END { print m, b }'; }
profile_round() {
  local v=$1 r=$2 m0 b0 m1 b1 lg_pid n secs
  secs=$((${DUR%s} - 2))
  ((secs >= 1)) || secs=1
  read -r m0 b0 <<<"$(memstat "$v")"
  "$BIN/loadgen" -subject "A/$v" -url "${pair_url[A/$v]}" -mode unique -concurrency 16 \
    -duration "$DUR" -warmup 0s >"$OUT/profile-$v-$r.log" 2>&1 &
  lg_pid=$!
  pids+=("$lg_pid")
  sleep 1
  curl -sf -o "$OUT/cpu-A-$v-$r.pprof" "http://127.0.0.1:${pprof_port[$v]}/debug/pprof/profile?seconds=$secs" ||
    failures+=("CPU profile of A/$v")
  wait "$lg_pid" || failures+=("profile load of A/$v")
  stop_pid "$lg_pid"
  read -r m1 b1 <<<"$(memstat "$v")"
  n=$(sed -n 's/.* clients, \([0-9]*\) requests in .*/\1/p' "$OUT/profile-$v-$r.log")
  if [[ -n $n && $n -gt 0 && -n $m0 && -n $m1 ]]; then
    echo "A/$v round $((r + 1)): $n requests, $(((m1 - m0) / n)) allocations and $(((b1 - b0) / n)) bytes per request" | tee -a "$LOG" "$OUT/profile-allocs.txt"
  else
    failures+=("allocations of A/$v")
  fi
}
if ((PROFILE)) && [[ $SUBJECTS == *A* ]]; then
  say "profiles of A's new keys, $PROFILE_ROUNDS rounds per ref"
  : >"$OUT/profile-allocs.txt"
  rm -f "$OUT"/cpu-A-*.pprof
  for ((r = 0; r < PROFILE_ROUNDS; r++)); do
    if ((r % 2 == 0)); then profile_round before "$r"; profile_round after "$r"
    else profile_round after "$r"; profile_round before "$r"; fi
  done
  {
    echo "Heap allocations per request (A, new keys, 16 clients):"
    echo
    sed 's/^/    /' "$OUT/profile-allocs.txt"
    for v in before after; do
      echo
      echo "\`go tool pprof -top\` of $v (${ref[$v]}), $PROFILE_ROUNDS profiles merged, top 40 by flat time:"
      echo
      go tool pprof -top -nodecount=40 "$BIN/$v/server" "$OUT"/cpu-A-"$v"-*.pprof 2>/dev/null | sed -n '/^Duration/p; /flat%/,$p' | cut -c1-160 | sed 's/^/    /'
    done
    go tool pprof -proto "$BIN/before/server" "$OUT"/cpu-A-before-*.pprof >"$OUT/cpu-A-before.pb.gz" 2>/dev/null
    echo
    echo "after - before, before scaled to after's total (\`pprof -top -diff_base -normalize\`), top 40:"
    echo
    go tool pprof -top -nodecount=40 -normalize -diff_base "$OUT/cpu-A-before.pb.gz" "$BIN/after/server" "$OUT"/cpu-A-after-*.pprof 2>/dev/null |
      sed -n '/flat%/,$p' | cut -c1-160 | sed 's/^/    /'
  } >"$OUT/profile.md"
  echo "wrote $OUT/profile.md"
fi
load_end=$(load_now)

report=$OUT/report.md
{
  echo "\`bench/beforeafter.sh ${ref[before]} ${ref[after]}\` on $run_date: before = \`${ref[before]}\` (\`${commit[before]:0:12}\`), after = \`${ref[after]}\` (\`${commit[after]:0:12}\`), $db_label;" \
    "$REPS blocks of adjacent before/after pairs, 16 clients, $DUR windows after a $WARM warm-up; $(machine_desc), load average $load_start at the start and $load_end at the end (\`uptime\`; the machine is shared)."
  echo
  "$BIN/pairreport" -base before -other after -db-label "$db_label" "$LOG"
} | tee "$report" || failures+=("pairreport")

if ((${#failures[@]})); then
  printf 'beforeafter.sh: FAILED: %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "wrote $report ($((SECONDS - started))s)"
