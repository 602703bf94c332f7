# Shared parts of the load benchmarks, sourced by bench/load.sh and
# bench/beforeafter.sh (not run on its own).
#
# The caller sets, before calling anything here:
#   OUT       the results directory (bench/results): servers' logs go there
#   LOG       the run's log, which every measurement is appended to
#   BIN       where the built binaries are (start_server's and start_noop's
#             defaults: $BIN/server, $BIN/noopserver, $BIN/loadgen)
#   BASE_DSN  the database URL the schemas are made in
#   DUR WARM SETTLE   loadgen's measured window, warm-up and settle bound
# and it may set SERVER_BIN and NOOP_BIN to start other builds (another
# git ref's). Everything started is in pids; cleanup stops it all and drops
# the schemas listed in bench_schemas (unless KEEP_SCHEMA=1).

pids=()
failures=()
bench_schemas=()

say() { echo "== $*" | tee -a "$LOG"; }

# with_schema DSN SCHEMA [APP]: the DSN with search_path set to SCHEMA (and
# application_name APP, by which db_pids_cmd finds the server's backends).
with_schema() {
  local sep='?' dsn
  [[ $1 == *\?* ]] && sep='&'
  dsn="$1${sep}options=-csearch_path%3D$2"
  [[ -n ${3:-} ]] && dsn+="&application_name=$3"
  echo "$dsn"
}

psql_q() { psql "$BASE_DSN" -X -q -v ON_ERROR_STOP=1 -c 'SET client_min_messages = warning' "$@"; }

# reset_schema SCHEMA: drops and creates SCHEMA, and has cleanup drop it.
reset_schema() {
  psql_q -c "DROP SCHEMA IF EXISTS $1 CASCADE" -c "CREATE SCHEMA $1"
  bench_schemas+=("$1")
}

# db_pids_cmd APP: the shell command loadgen's -db-pids-cmd runs to list the
# PostgreSQL backends of the server whose DSN carries application_name APP.
db_pids_cmd() {
  printf "psql %q -X -Atc \"SELECT pid FROM pg_stat_activity WHERE application_name = '%s'\"" "$BASE_DSN" "$1"
}

cleanup() {
  local pid s
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
  if [[ ${KEEP_SCHEMA:-0} != 1 ]]; then
    for s in "${bench_schemas[@]}"; do
      psql_q -c "DROP SCHEMA IF EXISTS $s CASCADE" 2>/dev/null || true
    done
  fi
  if declare -F cleanup_more >/dev/null; then cleanup_more; fi
}

# free_port prints a loopback port nothing listens on, below Linux's
# ephemeral range (32768 and up), where the run's own client connections
# hold local ports that a listener could not bind.
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# start_server NAME DSN [VAR=value...]: starts the example server
# ($SERVER_BIN, default $BIN/server) on a free port and waits for /healthz;
# sets SERVER_PID and SERVER_URL.
start_server() {
  local name=$1 dsn=$2 port
  shift 2
  port=$(free_port)
  # A clean slate whatever the caller's environment: middleware on, the
  # new-orders gate open and no sealing unless the arguments say otherwise.
  env -u MBT_NEW_ORDERS_DISABLED -u ORDER_LATENCY -u IDEMPOTENCY_SEAL_KEYS FLAG_IDEMPOTENCY_MIDDLEWARE=on \
    SESSION_SECRET=bench-load-secret DATABASE_URL="$dsn" "$@" \
    "${SERVER_BIN:-$BIN/server}" -addr "127.0.0.1:$port" -order-latency 0 >"$OUT/server-$name.log" 2>&1 &
  SERVER_PID=$!
  pids+=("$SERVER_PID")
  SERVER_URL=http://127.0.0.1:$port
  wait_up "$name" "${@/#IDEMPOTENCY_SEAL_KEYS=*/IDEMPOTENCY_SEAL_KEYS=(set)}" # never a seal key in the log
}

# start_noop NAME DSN [VAR=value...] [FLAG...]: starts bench/cmd/noopserver
# ($NOOP_BIN, default $BIN/noopserver; subject N) on a free port, middleware
# on, and waits for /healthz; sets SERVER_PID and SERVER_URL. Leading
# VAR=value arguments are its environment, the rest its flags.
start_noop() {
  local name=$1 dsn=$2 port vars=()
  shift 2
  while (($#)) && [[ $1 == [A-Z]*=* ]]; do vars+=("$1"); shift; done
  port=$(free_port)
  env -u IDEMPOTENCY_SEAL_KEYS FLAG_IDEMPOTENCY_MIDDLEWARE=on DATABASE_URL="$dsn" "${vars[@]}" \
    "${NOOP_BIN:-$BIN/noopserver}" -addr "127.0.0.1:$port" "$@" >"$OUT/server-$name.log" 2>&1 &
  SERVER_PID=$!
  pids+=("$SERVER_PID")
  SERVER_URL=http://127.0.0.1:$port
  wait_up "$name" "${vars[@]/#IDEMPOTENCY_SEAL_KEYS=*/IDEMPOTENCY_SEAL_KEYS=(set)}" "$@"
}

# wait_up NAME [WHAT...]: waits for the server just started to answer
# /healthz.
wait_up() {
  local name=$1
  shift
  for _ in $(seq 1 200); do
    if curl -sf "$SERVER_URL/healthz" >/dev/null 2>&1; then
      say "server $name up at $SERVER_URL (pid $SERVER_PID${*:+, $*})"
      return 0
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.2
  done
  echo "$(basename "$0"): server $name did not come up; its log:" >&2
  tail -n 20 "$OUT/server-$name.log" >&2
  exit 1
}

stop_pid() {
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local keep=() pid
  for pid in "${pids[@]}"; do [[ $pid == "$1" ]] || keep+=("$pid"); done
  pids=("${keep[@]}")
}

# run DESCRIPTION COMMAND...: runs one measurement into the log; a failure
# is remembered and the run goes on.
run() {
  local what=$1 rc=0
  shift
  { "$@" 2>&1 | tee -a "$LOG"; rc=${PIPESTATUS[0]}; } || true
  if ((rc != 0)); then
    failures+=("$what (exit $rc)")
    echo "!! $what failed (exit $rc)" | tee -a "$LOG"
  fi
}

# Each measured run first waits up to $SETTLE for other work on the machine
# to calm down (cores under 30% busy), and records what it found.
lg() { "$BIN/loadgen" -settle "$SETTLE" -duration "$DUR" -warmup "$WARM" "$@"; }

# loadgen's flags for N's route.
noop_lg=(-path /noop -body '{"symbol":"AAPL","side":"buy","qty":1}' -login=false)

# Paired comparisons (bench/beforeafter.sh, bench/load.sh -seal): servers
# registered under NAME/VARIANT (A/before, N/on ...), measured in blocks.
declare -A pair_url pair_pid pair_db

# pair_register NAME/VARIANT [DB_PIDS_CMD]: the server just started
# (SERVER_URL, SERVER_PID) is NAME/VARIANT; DB_PIDS_CMD lists its database
# processes (db_pids_cmd), for the database's CPU per request.
pair_register() {
  pair_url[$1]=$SERVER_URL
  pair_pid[$1]=$SERVER_PID
  pair_db[$1]=${2:-}
}

# pair_point NAME/VARIANT MODE: one loadgen run at 16 clients.
pair_point() {
  local s=$1 mode=$2 extra=()
  [[ $s == N/* ]] && extra=("${noop_lg[@]}")
  [[ -n ${pair_db[$s]} ]] && extra+=(-db-pids-cmd "${pair_db[$s]}")
  run "$s $mode c=16" lg -subject "$s" -url "${pair_url[$s]}" -server-pid "${pair_pid[$s]}" \
    -mode "$mode" -concurrency 16 "${extra[@]}"
}

# pair_blocks REPS V1 V2 NAME:MODE...: REPS blocks; a block runs each
# NAME:MODE once as NAME/V1 and once as NAME/V2, the two next to each
# other. The pairs' order rotates by one from block to block, and which
# variant of a pair goes first alternates (V1 V2, V2 V1, ...), so neither
# variant nor any pair keeps the same place in time; pairreport pairs the
# i-th runs of the two variants, which come from the same block.
pair_blocks() {
  local reps=$1 v1=$2 v2=$3 r i n p name mode
  shift 3
  local pts=("$@")
  n=${#pts[@]}
  for ((r = 0; r < reps; r++)); do
    say "block $((r + 1))/$reps"
    for ((i = 0; i < n; i++)); do
      p=$(((i + r) % n))
      name=${pts[p]%%:*} mode=${pts[p]#*:}
      if (((p + r) % 2 == 0)); then
        pair_point "$name/$v1" "$mode"
        pair_point "$name/$v2" "$mode"
      else
        pair_point "$name/$v2" "$mode"
        pair_point "$name/$v1" "$mode"
      fi
    done
  done
}

# machine_desc: the machine, for a report's header; load_now: its load
# average (`uptime`'s three figures).
machine_desc() { printf '%s cores (%s)' "$(nproc)" "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"; }
load_now() { cut -d' ' -f1-3 /proc/loadavg; }
