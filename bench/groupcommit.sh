#!/usr/bin/env bash
# Group commit (issue #37), measured against its targets in ONE interleaved
# run; `make bench/groupcommit` runs it.
#
#   bash bench/groupcommit.sh BEFORE_REF AFTER_REF    (default: main~ and the working tree's HEAD)
#   BEFORE_ENV="VAR=value ..." AFTER_ENV="..."       each side's servers' environment
#                                                    (e.g. GOMAXPROCS=1, or NOOP_BATCH_SLOTS=1 for
#                                                    N's slots; the refs may then be equal)
#
# Builds bench/cmd/noopserver (N: an ordinary route, a no-op handler) and the
# example server (A: its order route, transactional) at both refs, as
# bench/beforeafter.sh does, each in a schema of its own, and measures in REPS
# blocks (default 3) of DUR windows (5s) after a WARM warm-up (1s); a block
# runs, in an order that rotates from block to block:
#   N new keys at 16 and 64 clients, before and after, next to each other;
#   F the narrow-table floor at 16 and 64 clients: pgbench, one new key per
#     transaction pair, a claim INSERT ... RETURNING and its record UPDATE on a
#     table with one unique index (what any store must do per new key);
#   N replays (one hot key) at 16 clients, before and after, and H the
#     hot-select floor: sqlfloor's claim of a completed key straight through
#     pgx, no HTTP (C hot of bench/load.sh);
#   N new keys at 1 client, before and after (latency: p50), and at 2 clients
#     (a second call finding a round in flight: what fewer slots cost);
#   A new keys at 16 clients, before and after (transactional routes do not
#   batch: not slower).
# Needs max_connections of at least 160 (four servers' pools of 20, and 64
# pgbench clients). Prints a Markdown table of the medians (req/s, p50, server CPU and
# PostgreSQL CPU per request) and the ratios the targets name, into
# bench/results/groupcommit/report.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/lib.sh
root=$PWD

before=${1:-main~} after=${2:-HEAD}
REPS=${REPS:-3} DUR=${DUR:-5s} WARM=${WARM:-1s} SETTLE=${SETTLE:-5s}
BASE_DSN=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
OUT=bench/results/groupcommit
BIN=$OUT/bin
LOG=$OUT/run.log
rm -rf "$BIN" && mkdir -p "$BIN/before" "$BIN/after"
: >"$LOG"
failures=()
tmp=$(mktemp -d "${TMPDIR:-/tmp}/groupcommit.XXXXXX")
cleanup_more() {
  local d
  for d in "$tmp"/before "$tmp"/after; do [[ -d $d ]] && git worktree remove --force "$d" 2>/dev/null; done
  rm -rf "$tmp"
  git worktree prune 2>/dev/null || true
  psql_q -c "DROP SCHEMA IF EXISTS idem_gc_floor CASCADE" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

(cd bench && go build -o "$root/$BIN/" ./cmd/loadgen ./cmd/sqlfloor)
"$BIN/sqlfloor" -check -database-url "$BASE_DSN"
declare -A commit
for v in before after; do
  r=$before
  [[ $v == after ]] && r=$after
  commit[$v]=$(git rev-parse --verify "$r^{commit}")
  say "building $v = $r (${commit[$v]:0:12})"
  git worktree add --detach --quiet "$tmp/$v" "${commit[$v]}"
  (cd "$tmp/$v" && GOWORK=off go build -o "$root/$BIN/$v/server" ./examples/server)
  (cd "$tmp/$v/bench" && GOWORK=off go build -o "$root/$BIN/$v/noopserver" ./cmd/noopserver)
  git worktree remove --force "$tmp/$v"
done

for v in before after; do
  envs=${BEFORE_ENV:-}
  [[ $v == after ]] && envs=${AFTER_ENV:-}
  read -ra envs <<<"$envs"
  for s in N A; do
    name="idem_gc_${s,,}_$v"
    reset_schema "$name"
    dsn=$(with_schema "$BASE_DSN" "$name" "$name")
    case $s in
      N) NOOP_BIN=$BIN/$v/noopserver start_noop "N-$v" "$dsn" "${envs[@]}" ;;
      A) SERVER_BIN=$BIN/$v/server start_server "A-$v" "$dsn" "${envs[@]}" ;;
    esac
    pair_register "$s/$v" "$(db_pids_cmd "$name")"
  done
done

# The narrow-table floor's table and script.
psql_q -c "DROP SCHEMA IF EXISTS idem_gc_floor CASCADE" -c "CREATE SCHEMA idem_gc_floor" \
  -c "CREATE TABLE idem_gc_floor.k (id BIGSERIAL, scope TEXT NOT NULL, k TEXT NOT NULL, endpoint TEXT NOT NULL,
        request_hash BYTEA NOT NULL, status TEXT NOT NULL, attempt INT NOT NULL, response_code SMALLINT,
        response_body BYTEA, locked_until TIMESTAMPTZ NOT NULL, expires_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (scope, k, endpoint))"
cat >"$tmp/floor.sql" <<'SQL'
\set key random(1, 9223372036854775806)
INSERT INTO idem_gc_floor.k (scope, k, endpoint, request_hash, status, attempt, locked_until, expires_at) VALUES ('1', :key::text, 'POST /noop', '\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', 'in_flight', 1, now() + interval '30 seconds', now() + interval '24 hours') ON CONFLICT DO NOTHING RETURNING id, attempt
\gset c_
UPDATE idem_gc_floor.k SET status = 'completed', response_code = 201, response_body = '\x7b226f6b223a747275657d' WHERE scope = '1' AND k = :key::text AND endpoint = 'POST /noop' AND id = :c_id AND attempt = :c_attempt;
SQL

# floor_point CLIENTS: one pgbench run of the floor, as a SUMMARY line.
floor_point() {
  local c=$1 out
  out=$(pgbench -n -M prepared -f "$tmp/floor.sql" -c "$c" -j 2 -T "${DUR%s}" "$BASE_DSN" 2>&1) || { failures+=("floor c=$c"); echo "$out" >>"$LOG"; return; }
  local tps
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out" | tail -n1)
  echo "F floor c=$c: $tps tps" | tee -a "$LOG"
  echo "SUMMARY {\"tool\":\"pgbench\",\"subject\":\"F\",\"mode\":\"unique\",\"concurrency\":$c,\"rps\":$tps}" >>"$LOG"
}
hot_floor() {
  run "H hot c=16" "$BIN/sqlfloor" -settle "$SETTLE" -database-url "$BASE_DSN" -schema idem_gc_hot -subject H -mode hot \
    -concurrency 16 -duration "$DUR" -warmup "$WARM"
}
# point NAME/VARIANT MODE CLIENTS: one loadgen run.
point() {
  local s=$1 mode=$2 c=$3 extra=()
  [[ $s == N/* ]] && extra=("${noop_lg[@]}")
  run "$s $mode c=$c" lg -subject "$s" -url "${pair_url[$s]}" -server-pid "${pair_pid[$s]}" \
    -db-pids-cmd "${pair_db[$s]}" -mode "$mode" -concurrency "$c" "${extra[@]}"
}
pair() { # pair NAME MODE CLIENTS BLOCK: before and after, next to each other, alternating
  if (($4 % 2 == 0)); then point "$1/before" "$2" "$3"; point "$1/after" "$2" "$3"
  else point "$1/after" "$2" "$3"; point "$1/before" "$2" "$3"; fi
}
steps=("pair N unique 16" "floor_point 16" "pair N unique 64" "floor_point 64" "pair N hot 16" "hot_floor" "pair N unique 1" "pair N unique 2" "pair A unique 16")
load_start=$(load_now)
for ((r = 0; r < REPS; r++)); do
  say "block $((r + 1))/$REPS"
  for ((i = 0; i < ${#steps[@]}; i++)); do
    read -ra st <<<"${steps[(i + r) % ${#steps[@]}]}"
    if [[ ${st[0]} == pair ]]; then pair "${st[1]}" "${st[2]}" "${st[3]}" "$r"; else "${st[@]}"; fi
  done
done
load_end=$(load_now)

# The report: medians over the blocks, from the SUMMARY lines.
sums=$(sed -n 's/^SUMMARY //p' "$LOG")
med() { # med SUBJECT MODE CLIENTS FIELD
  jq -rs --arg s "$1" --arg m "$2" --argjson c "$3" --arg f "$4" \
    '[.[] | select(.subject == $s and .mode == $m and .concurrency == $c) | .[$f] // 0] | sort |
      if length == 0 then 0 else .[(length - 1) / 2 | floor] end' <<<"$sums"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
{
  echo "\`${BEFORE_ENV:+BEFORE_ENV=\"$BEFORE_ENV\" }${AFTER_ENV:+AFTER_ENV=\"$AFTER_ENV\" }bench/groupcommit.sh $before $after\` on $(date -u '+%Y-%m-%d %H:%M UTC'): before = \`${commit[before]:0:12}\`, after = \`${commit[after]:0:12}\`;" \
    "$REPS interleaved blocks, $DUR windows after a $WARM warm-up; $(machine_desc), load average $load_start at the start and $load_end at the end."
  echo
  echo "| point | before req/s | after req/s | after/before | before p50 ms | after p50 ms | server CPU µs/req before → after | PostgreSQL CPU µs/req before → after |"
  echo "|---|--:|--:|--:|--:|--:|--:|--:|"
  for p in "N unique 16" "N unique 64" "N hot 16" "N unique 1" "N unique 2" "A unique 16"; do
    read -r s m c <<<"$p"
    b=$(med "$s/before" "$m" "$c" rps) a=$(med "$s/after" "$m" "$c" rps)
    printf '| %s %s, %s clients | %.0f | %.0f | %s | %.2f | %.2f | %.0f → %.0f | %.0f → %.0f |\n' "$s" "$m" "$c" "$b" "$a" "$(ratio "$a" "$b")" \
      "$(med "$s/before" "$m" "$c" p50_ms)" "$(med "$s/after" "$m" "$c" p50_ms)" \
      "$(med "$s/before" "$m" "$c" cpu_server_us)" "$(med "$s/after" "$m" "$c" cpu_server_us)" \
      "$(med "$s/before" "$m" "$c" cpu_db_us)" "$(med "$s/after" "$m" "$c" cpu_db_us)"
  done
  echo
  for c in 16 64; do
    f=$(med F unique "$c" rps)
    echo "- new keys / the narrow-table floor at $c clients ($(printf '%.0f' "$f") keys/s): before $(ratio "$(med N/before unique "$c" rps)" "$f"), after $(ratio "$(med N/after unique "$c" rps)" "$f")"
  done
  h=$(med H hot 16 rps)
  echo "- replays / the hot-select floor at 16 clients ($(printf '%.0f' "$h") claims/s): before $(ratio "$(med N/before hot 16 rps)" "$h"), after $(ratio "$(med N/after hot 16 rps)" "$h")"
} | tee "$OUT/report.md"
if ((${#failures[@]})); then
  printf 'groupcommit.sh: FAILED: %s\n' "${failures[@]}" >&2
  exit 1
fi
