#!/usr/bin/env bash
# Load benchmark of the example server (issue #7); `make bench/load` runs it.
#
#   bash bench/load.sh           full run, about 6 minutes
#   bash bench/load.sh -quick    shorter windows, one run per point, about 2 minutes
#   bash bench/load.sh -seal     only sealing off against on (issue #26), about 7 minutes
#                                (-seal -quick: one block; SEAL_REPS=N: N blocks); prints its table, writes
#                                bench/results/seal.md and leaves BENCHMARKS.md alone
#
# Subjects, all on the order route with -order-latency 0:
#   A  the example server, middleware on, a new Idempotency-Key per request
#   B  the same server and the same keyed requests, middleware off
#      (FLAG_IDEMPOTENCY_MIDDLEWARE=0), so the handler's work is identical
#   C  the floor: the library's Claim+Complete through pgx, no HTTP (sqlfloor)
#   P  pgbench running the same claim/complete SQL, and A's and B's SQL
#      without HTTP (the order transaction with and without the claim and
#      record: A's one transaction, the earlier two-commit design, and the
#      one transaction with BEGIN and COMMIT on their own round trips), when pgbench is
#      installed
# at 1, 4, 16 and 64 clients, in blocks of one run per subject whose order
# rotates from block to block (at 16 clients a block also holds A's replays
# of one hot key, A without a key and C's replays, so replay/miss pairs runs
# of one block); and at 16 clients only, in the same blocks:
#   N  bench/cmd/noopserver: an ordinary (non-transactional) fail-closed
#      route whose handler does nothing, behind the middleware on the
#      Postgres store; new keys and one hot key replayed
#   N0 the same binary with -floor: the same route and pool without the
#      middleware, running N's statements by hand through pgx (the floor
#      of net/http + pgx + loopback TCP); new keys and one hot key
#   P  pgbench running N's own statements with N's values: claim+complete
#      (noop_unique) and the replay's claim (noop_hot)
# then a storm of concurrent copies (exits non-zero on any double
# execution), the database round trips per request (through the pgrtt
# proxy) and CPU profiles of A and of N (into bench/results) at 16 clients.
#
# -seal: A (new keys and one hot key) and N (the same) on servers storing
# plaintext and on servers sealing (IDEMPOTENCY_SEAL_KEYS, a throwaway key),
# each in a schema of its own (idem_bench_seal_*), in blocks of adjacent
# off/on pairs (bench/lib.sh pair_blocks), with server and PostgreSQL CPU
# per request.
#
# Writes bench/results/ (ignored by git: logs, latest.json, profile); and,
# only when every measurement succeeded, bench/chart.svg and the figures
# section of BENCHMARKS.md (a failed run leaves its drafts in bench/results/
# and publishes nothing).
#
# Environment: DATABASE_URL (default
# postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable) must be a
# PostgreSQL on this machine; the run works in the schemas idem_bench_a,
# idem_bench_b (A's and B's: neither grows the other's tables),
# idem_bench_noop (N's), idem_bench_noop0 (N0's), idem_bench_floor and
# idem_bench_pgbench, dropped and created afresh, and dropped at the end
# unless KEEP_SCHEMA=1. All load goes to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/lib.sh
started=$SECONDS

quick=0 seal=0
for arg in "$@"; do
  case $arg in
    -quick | --quick) quick=1 ;;
    -seal | --seal) seal=1 ;;
    -h | --help) sed -n '2,53p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "load.sh: unknown argument $arg (want -quick, -seal)" >&2; exit 2 ;;
  esac
done

if ((quick)); then
  DUR=2s WARM=500ms SETTLE=2s REPS=1 REPS16=1 STORM_ROUNDS=1 RTT_DUR=1s PGB_T=2 PROFILE=0
else
  DUR=5s WARM=1s SETTLE=5s REPS=3 REPS16=3 STORM_ROUNDS=3 RTT_DUR=2s PGB_T=5 PROFILE=1
fi
LEVELS=(1 4 16 64)
STORM_KEYS=50 STORM_COPIES=32

BASE_DSN=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
OUT=bench/results
BIN=$OUT/bin
LOG=$OUT/run.log
mkdir -p "$BIN"
: >"$LOG"

for tool in go psql curl; do
  command -v "$tool" >/dev/null || { echo "load.sh: $tool is required" >&2; exit 1; }
done

say "building the example server and the bench tools"
go build -o "$BIN/server" ./examples/server
(cd bench && go build -o "results/bin/" ./cmd/...)

# Refuse a database off this machine before anything connects to it.
"$BIN/sqlfloor" -check -database-url "$BASE_DSN"
trap cleanup EXIT
trap 'exit 130' INT TERM

# -seal: sealing off against on, nothing else.
if ((seal)); then
  reps=$REPS16
  ((quick)) || reps=${SEAL_REPS:-5}
  loadavg=$(load_now) run_date=$(date -u '+%Y-%m-%d %H:%M UTC')
  seal_keys="bench1:$(head -c 32 /dev/urandom | base64)"
  for v in off on; do
    keys=()
    [[ $v == on ]] && keys=(IDEMPOTENCY_SEAL_KEYS="$seal_keys")
    reset_schema "idem_bench_seal_a_$v"
    start_server "A-seal-$v" "$(with_schema "$BASE_DSN" "idem_bench_seal_a_$v" "idem_bench_seal_a_$v")" "${keys[@]}"
    pair_register "A/$v" "$(db_pids_cmd "idem_bench_seal_a_$v")"
    reset_schema "idem_bench_seal_n_$v"
    start_noop "N-seal-$v" "$(with_schema "$BASE_DSN" "idem_bench_seal_n_$v" "idem_bench_seal_n_$v")" "${keys[@]}"
    pair_register "N/$v" "$(db_pids_cmd "idem_bench_seal_n_$v")"
  done
  grep -q 'sealing stored responses' "$OUT/server-A-seal-on.log" "$OUT/server-N-seal-on.log" ||
    { echo "load.sh: a sealed server did not say it seals" >&2; exit 1; }
  say "sealing off against on: A and N, new keys and one hot key, 16 clients, $reps blocks, $DUR each after a $WARM warm-up"
  pair_blocks "$reps" off on A:unique A:hot N:unique N:hot
  {
    echo "\`make bench/load/seal\`$( ((quick)) && echo ' (-quick)') at commit \`$(git rev-parse --short HEAD)\`, $run_date:" \
      "$reps blocks of adjacent off/on pairs, 16 clients, ${DUR} windows after a $WARM warm-up; $(machine_desc), load average $loadavg at the start and $(load_now) at the end (\`uptime\`; the machine is shared)."
    echo
    "$BIN/pairreport" -base off -other on "$LOG"
  } | tee "$OUT/seal.md" || failures+=("pairreport")
  if ((${#failures[@]})); then
    printf 'load.sh: FAILED: %s\n' "${failures[@]}" >&2
    exit 1
  fi
  echo "wrote $OUT/seal.md ($((SECONDS - started))s)"
  exit 0
fi

reset_schema idem_bench_a
reset_schema idem_bench_b
reset_schema idem_bench_noop
reset_schema idem_bench_noop0
DSN_A=$(with_schema "$BASE_DSN" idem_bench_a)
DSN_B=$(with_schema "$BASE_DSN" idem_bench_b)
DSN_N=$(with_schema "$BASE_DSN" idem_bench_noop)
DSN_N0=$(with_schema "$BASE_DSN" idem_bench_noop0)

loadavg=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
run_date=$(date -u '+%Y-%m-%d %H:%M UTC')
start_server A "$DSN_A"
A_PID=$SERVER_PID A_URL=$SERVER_URL
start_server B "$DSN_B" FLAG_IDEMPOTENCY_MIDDLEWARE=0
B_PID=$SERVER_PID B_URL=$SERVER_URL
start_noop N "$DSN_N"
N_PID=$SERVER_PID N_URL=$SERVER_URL
start_noop N0 "$DSN_N0" -floor
N0_PID=$SERVER_PID N0_URL=$SERVER_URL

# pgbench, when installed: its schema and scripts now, since N's pgbench
# points run inside the sweep's blocks at 16 clients.
have_pgbench=0
command -v pgbench >/dev/null && have_pgbench=1
pgb=$OUT/pgbench
# The values every script shares (the middleware sends a new owner token
# per request; one fixed token matches no row's status here either), then
# the order route's and N's rows.
pgb_common=(-D hash=5f1e3d0b9c8a7f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291807f6e
  -D "ttl=24 hours" -D "lease=30 seconds" -D owner=3c9d2f4e-8b1a-4c6d-9e7f-1a2b3c4d5e6f
  -D hotkey=0b6f3c1e-9a2d-4e7f-8c5b-3d1a2e4f6a8b)
pgb_vars=("${pgb_common[@]}" -D scope=1 -D "endpoint=POST /api/trading/orders" -D code=201
  -D 'body={"id":1,"symbol":"AAPL","side":"buy","qty":1,"status":"filled","fill_price":187.43}'
  -D 'headers={"Content-Type":["application/json"],"Location":["/api/trading/orders/1"]}')
pgb_noop_vars=("${pgb_common[@]}")
while IFS= read -r v; do pgb_noop_vars+=(-D "$v"); done < <("$BIN/noopserver" -pgbench-vars)
if ((have_pgbench)); then
  reset_schema idem_bench_pgbench
  rm -rf "$pgb" && mkdir -p "$pgb"
  "$BIN/pgbenchsql" -src . -example examples/server/postgres.go -out "$pgb"
  for f in migrations/*.up.sql "$pgb/example_schema.sql"; do
    PGOPTIONS='-c search_path=idem_bench_pgbench' psql "$BASE_DSN" -X -q -v ON_ERROR_STOP=1 -f "$f"
  done
  # The hot key's completed row, once with the order route's values and
  # once with N's (another endpoint: another row).
  for arr in pgb_vars pgb_noop_vars; do
    declare -n vs=$arr
    (cd "$pgb" && PGOPTIONS='-c search_path=idem_bench_pgbench' \
      pgbench -n -M prepared "${vs[@]}" -f hot_setup.sql -c 1 -t 1 "$BASE_DSN" >/dev/null)
    unset -n vs
  done
fi

# pgbench_run MODE SCRIPT [VARS]: one pgbench run at 16 clients, with the
# order route's variables or the array named VARS.
pgbench_run() {
  local dir=$pgb/$1 out tps failed
  declare -n vars=${3:-pgb_vars}
  rm -rf "$dir" && mkdir -p "$dir" # this run's logs only
  out=$( (cd "$dir" && PGOPTIONS='-c search_path=idem_bench_pgbench' \
    pgbench -n -M prepared "${vars[@]}" -f "../$2" -c 16 -j 2 -T "$PGB_T" -l "$BASE_DSN") 2>&1) || {
    failures+=("pgbench $1")
    echo "$out" | tail -n 5 | tee -a "$LOG"
    return 0
  }
  echo "$out" | grep -E '^(tps|latency average|number of failed)' | sed 's/^/  pgbench: /' | tee -a "$LOG"
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
  failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' <<<"$out")
  run "P $1" "$BIN/pgbenchsql" -summarize -logs "$dir" -mode "$1" -concurrency 16 -tps "${tps:-0}" -failed "${failed:-0}"
}

floor() { "$BIN/sqlfloor" -settle "$SETTLE" -database-url "$BASE_DSN" -schema idem_bench_floor -duration "$DUR" -warmup "$WARM" "$@"; }

# point NAME C: one measured run of the sweep.
point() {
  case $1 in
    A) run "A unique c=$2" lg -subject A -url "$A_URL" -server-pid "$A_PID" -mode unique -concurrency "$2" ;;
    B) run "B unique c=$2" lg -subject B -url "$B_URL" -server-pid "$B_PID" -mode unique -concurrency "$2" ;;
    C) run "C unique c=$2" floor -subject C -mode unique -concurrency "$2" ;;
    Ahot) run "A hot c=$2" lg -subject A -url "$A_URL" -server-pid "$A_PID" -mode hot -concurrency "$2" ;;
    Anokey) run "A nokey c=$2" lg -subject A -url "$A_URL" -server-pid "$A_PID" -mode nokey -concurrency "$2" ;;
    Chot) run "C hot c=$2" floor -subject C -mode hot -concurrency "$2" ;;
    N) run "N unique c=$2" lg -subject N -url "$N_URL" -server-pid "$N_PID" -mode unique -concurrency "$2" "${noop_lg[@]}" ;;
    Nhot) run "N hot c=$2" lg -subject N -url "$N_URL" -server-pid "$N_PID" -mode hot -concurrency "$2" "${noop_lg[@]}" ;;
    N0) run "N0 unique c=$2" lg -subject N0 -url "$N0_URL" -server-pid "$N0_PID" -mode unique -concurrency "$2" "${noop_lg[@]}" ;;
    N0hot) run "N0 hot c=$2" lg -subject N0 -url "$N0_URL" -server-pid "$N0_PID" -mode hot -concurrency "$2" "${noop_lg[@]}" ;;
    PN) say "pgbench: N's claim+complete, ${PGB_T}s"; pgbench_run noop_unique miss.sql pgb_noop_vars ;;
    PNhot) say "pgbench: N's replay (the claim of a completed key), ${PGB_T}s"; pgbench_run noop_hot hot.sql pgb_noop_vars ;;
  esac
}

# Blocks: one run of each point, the order rotating by one from block to
# block, so each point takes every position in turn rather than always
# running first or last; benchreport pairs the i-th runs of two points,
# which come from the same block.
say "sweep: A, B and C at ${LEVELS[*]} clients (and A hot, A nokey, C hot, N, N hot, N0 and N0 hot, and pgbench of N's SQL at 16), $DUR each after a $WARM warm-up, in rotating blocks"
block=0
for c in "${LEVELS[@]}"; do
  reps=$REPS points=(A B C)
  if ((c == 16)); then
    reps=$REPS16 points=(A B C Ahot Anokey Chot N Nhot N0 N0hot)
    ((have_pgbench)) && points+=(PN PNhot)
  fi
  for ((r = 1; r <= reps; r++)); do
    n=${#points[@]}
    for ((i = 0; i < n; i++)); do
      point "${points[(i + block) % n]}" "$c"
    done
    block=$((block + 1))
  done
done
run "C claim" floor -subject C -mode claim -concurrency 16

if ((have_pgbench)); then
  say "pgbench: the library's claim and complete SQL at 16 clients, ${PGB_T}s each"
  pgbench_run unique miss.sql
  # A's and B's SQL alone, paired like A and B: what A/B would be if HTTP
  # and Go cost nothing.
  # order_idem is the two-commit design (the claim committed alone);
  # order_idem_tx_all the one transaction A runs now (BEGIN pipelined with
  # the claim, COMMIT with the record); order_idem_tx the same with BEGIN
  # and COMMIT on round trips of their own, as pgx's Begin and Commit send
  # them (the design before).
  for ((r = 1; r <= REPS16; r++)); do
    pgbench_run order_idem_tx order_idem_tx.sql
    pgbench_run order order.sql
    pgbench_run order_idem order_idem.sql
    pgbench_run order_idem_tx_all order_idem_tx_all.sql
  done
  pgbench_run hot hot.sql
else
  say "pgbench not found: subject P skipped (install postgresql-contrib or the client package that ships it)"
fi

say "storm: $STORM_KEYS keys x $STORM_COPIES copies, $STORM_ROUNDS round(s), against A; then once against B as a control"
run "storm A" "$BIN/loadgen" -subject A -url "$A_URL" -mode storm -keys "$STORM_KEYS" -copies "$STORM_COPIES" -rounds "$STORM_ROUNDS" -duration 2m
if ! "$BIN/loadgen" -subject B -url "$B_URL" -mode storm -keys "$STORM_KEYS" -copies "$STORM_COPIES" -rounds 1 -duration 1m -allow-double 2>&1 | tee -a "$LOG"; then
  echo "   (the control's exit status is not checked)" | tee -a "$LOG"
fi
stop_pid "$A_PID"
stop_pid "$B_PID"
stop_pid "$N_PID"
stop_pid "$N0_PID"

say "database round trips per request: A and B through the pgrtt proxy, 16 clients, $RTT_DUR each"
pg_host_port=$(psql "$BASE_DSN" -X -Atc "SELECT CASE family(inet_server_addr()) WHEN 6 THEN '[' || host(inet_server_addr()) || ']'
  ELSE coalesce(host(inet_server_addr()), '127.0.0.1') END || ':' || current_setting('port')")
rtt_port=$(free_port) rtt_http=$(free_port)
"$BIN/pgrtt" -listen "127.0.0.1:$rtt_port" -http "127.0.0.1:$rtt_http" -upstream "$pg_host_port" -lifetime 5m >"$OUT/pgrtt.log" 2>&1 &
RTT_PID=$!
pids+=("$RTT_PID")
sleep 0.5
# Point the proxied servers at the proxy: same URL, host and port replaced.
rtt_dsn() {
  with_schema "postgres://${BASE_DSN#*://}" "$1" | sed -E "s#^(postgres(ql)?://([^@/]*@)?)[^/?]*#\1127.0.0.1:$rtt_port#"
}
start_server A-rtt "$(rtt_dsn idem_bench_a)"
AR_PID=$SERVER_PID AR_URL=$SERVER_URL
start_server B-rtt "$(rtt_dsn idem_bench_b)" FLAG_IDEMPOTENCY_MIDDLEWARE=0
BR_PID=$SERVER_PID BR_URL=$SERVER_URL
start_noop N-rtt "$(rtt_dsn idem_bench_noop)"
NR_PID=$SERVER_PID NR_URL=$SERVER_URL
# The warm-up opens the fresh servers' connections and prepares their
# statements; loadgen counts round trips from its end, over the window's
# requests only.
rtt() { "$BIN/loadgen" -duration "$RTT_DUR" -warmup "$WARM" -concurrency 16 -rtt-url "http://127.0.0.1:$rtt_http/counts" "$@"; }
run "A/rtt unique" rtt -subject A/rtt -url "$AR_URL" -mode unique
run "B/rtt unique" rtt -subject B/rtt -url "$BR_URL" -mode unique
run "A/rtt hot" rtt -subject A/rtt -url "$AR_URL" -mode hot
run "A/rtt nokey" rtt -subject A/rtt -url "$AR_URL" -mode nokey
run "N/rtt unique" rtt -subject N/rtt -url "$NR_URL" -mode unique "${noop_lg[@]}"
run "N/rtt hot" rtt -subject N/rtt -url "$NR_URL" -mode hot "${noop_lg[@]}"
stop_pid "$AR_PID"
stop_pid "$BR_PID"
stop_pid "$NR_PID"
stop_pid "$RTT_PID"

profile_txt=
if ((PROFILE)); then
  say "CPU profile of the example server (A, new keys, 16 clients)"
  overlay=$OUT/overlay.json
  printf '{"Replace":{"%s":"%s"}}\n' "$PWD/examples/server/zz_bench_pprof.go" "$PWD/bench/profile/pprof.go.in" >"$overlay"
  go build -overlay "$overlay" -o "$BIN/server-pprof" ./examples/server
  pprof_port=$(free_port)
  SERVER_BIN=$BIN/server-pprof start_server A-pprof "$DSN_A" BENCH_PPROF_ADDR="127.0.0.1:$pprof_port"
  AP_PID=$SERVER_PID AP_URL=$SERVER_URL
  "$BIN/loadgen" -subject A/pprof -url "$AP_URL" -mode unique -concurrency 16 -duration 8s -warmup 1s >"$OUT/profile-load.log" 2>&1 &
  lg_pid=$!
  pids+=("$lg_pid")
  sleep 2
  curl -sf -o "$OUT/cpu-A-unique-c16.pprof" "http://127.0.0.1:$pprof_port/debug/pprof/profile?seconds=5"
  wait "$lg_pid" || true
  stop_pid "$lg_pid"
  stop_pid "$AP_PID"
  {
    echo "go tool pprof -top -cum (top 45), 5 s of the server under 16 clients:"
    go tool pprof -top -cum -nodecount=45 "$BIN/server-pprof" "$OUT/cpu-A-unique-c16.pprof" 2>/dev/null |
      sed -n '/^Duration/p; /flat%/,$p' | cut -c1-150
  } >"$OUT/cpu-A-unique-c16.txt"
  profile_txt=$OUT/cpu-A-unique-c16.txt

  # N's two paths, for bench/results only (not in BENCHMARKS.md): what the
  # middleware and the store cost with no handler work around them.
  say "CPU profiles of the no-op server (N, new keys and replays, 16 clients)"
  pprof_port=$(free_port)
  start_noop N-pprof "$DSN_N" -pprof "127.0.0.1:$pprof_port"
  NP_PID=$SERVER_PID NP_URL=$SERVER_URL
  for mode in unique hot; do
    "$BIN/loadgen" -subject N/pprof -url "$NP_URL" -mode "$mode" -concurrency 16 -duration 8s -warmup 1s "${noop_lg[@]}" \
      >"$OUT/profile-N-$mode-load.log" 2>&1 &
    lg_pid=$!
    pids+=("$lg_pid")
    sleep 2
    curl -sf -o "$OUT/cpu-N-$mode-c16.pprof" "http://127.0.0.1:$pprof_port/debug/pprof/profile?seconds=6"
    wait "$lg_pid" || true
    stop_pid "$lg_pid"
    go tool pprof -top -cum -nodecount=45 "$BIN/noopserver" "$OUT/cpu-N-$mode-c16.pprof" 2>/dev/null |
      sed -n '/^Duration/p; /flat%/,$p' | cut -c1-150 >"$OUT/cpu-N-$mode-c16.txt"
  done
  stop_pid "$NP_PID"
fi

say "report"
# Drafts first; they replace the published files only if every measurement
# succeeded, so a failed run publishes nothing.
draft=$OUT/draft
rm -rf "$draft" && mkdir -p "$draft"
cp BENCHMARKS.md "$draft/BENCHMARKS.md"
"$BIN/benchreport" -in "$LOG" -json "$draft/latest.json" -svg "$draft/chart.svg" -svg-link bench/chart.svg \
  -md "$draft/BENCHMARKS.md" \
  -command "make bench/load$( ((quick)) && echo ' (bash bench/load.sh -quick)')" \
  -profile "$profile_txt" -quick="$((quick))" -duration "$DUR" -repeats "$REPS" -date "$run_date" \
  -commit "$(git rev-parse --short HEAD 2>/dev/null || true)" \
  -nproc "$(nproc)" -cpu "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)" \
  -memory "$(free -h | awk '/^Mem:/ {print $2}')" \
  -postgres "$(psql "$BASE_DSN" -X -Atc 'SHOW server_version')" \
  -go "$(go env GOVERSION)" -loadavg "$loadavg" | tee "$OUT/report.txt" ||
  failures+=("benchreport")

if ((${#failures[@]})); then
  printf 'load.sh: FAILED: %s\n' "${failures[@]}" >&2
  echo "load.sh: nothing published; the drafts are in $draft ($((SECONDS - started))s)" >&2
  exit 1
fi
mv "$draft/latest.json" "$OUT/latest.json"
mv "$draft/chart.svg" bench/chart.svg
mv "$draft/BENCHMARKS.md" BENCHMARKS.md
echo "wrote $OUT/latest.json, bench/chart.svg and BENCHMARKS.md ($((SECONDS - started))s)"
