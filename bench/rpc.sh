#!/usr/bin/env bash
# The gRPC and Connect interceptors' cost on a no-op unary method, beside
# the HTTP middleware's on the same no-op, in one run (issue #24):
# BenchmarkUnary of contrib/grpc and contrib/connect, 16 clients, on the
# PostgreSQL of IDEMPOTENCY_TEST_DATABASE_URL. Each point runs the method
# with the middleware and without it side by side (every client alternates
# one call of each), so both meet the same moment of a shared machine;
# the ratio is the mean latency without over the mean latency with, that
# is the throughput with the middleware over the throughput without it at
# the same concurrency. Each module's run holds its RPC points and the
# HTTP ones; a block runs both modules, in an order that alternates from
# block to block, and the table shows the median over the blocks with
# each block's ratio.
#
#   bash bench/rpc.sh            # 5 blocks of 2s points, about 4 minutes
#   BLOCKS=3 BENCHTIME=1s bash bench/rpc.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${IDEMPOTENCY_TEST_DATABASE_URL:=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}"
export IDEMPOTENCY_TEST_DATABASE_URL IDEMPOTENCY_REQUIRE_DB=1 GOWORK=off
BLOCKS=${BLOCKS:-5}
BENCHTIME=${BENCHTIME:-2s}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for mod in grpc connect; do (cd "contrib/$mod" && go test -c -o /dev/null .); done # build outside the blocks
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1 /proc/loadavg)
for ((blk = 1; blk <= BLOCKS; blk++)); do
	order="grpc connect"
	((blk % 2 == 0)) && order="connect grpc"
	for mod in $order; do
		(cd "contrib/$mod" && go test -run '^$' -bench '^BenchmarkUnary$' -benchtime "$BENCHTIME" -count 1 .) |
			awk -v blk="$blk" -v mod="$mod" '/^BenchmarkUnary\//{
				name = $1; sub(/^BenchmarkUnary\//, "", name); sub(/-[0-9]+$/, "", name)
				for (i = 3; i < NF; i++) { if ($(i+1) == "plain-ns/call") p = $i; if ($(i+1) == "keyed-ns/call") k = $i; if ($(i+1) == "plain/keyed") r = $i }
				print blk, mod, name, p, k, r
			}' >>"$out"
		grep -q "^$blk $mod " "$out" || { echo "bench/rpc.sh: $mod produced no result in block $blk" >&2; exit 1; }
	done
done
echo "blocks: $BLOCKS, benchtime: $BENCHTIME, $(nproc) cores, started $started, ended $(date -u '+%H:%M UTC'), load average at the start $load0, at the end $(cut -d' ' -f1 /proc/loadavg), commit $(git rev-parse --short HEAD)"
echo
echo "| module | transport, keys | µs/call without / with the middleware (medians) | with / without throughput, median | per block |"
echo "|---|---|--:|--:|---|"
awk '
function median(s,   a, n, i, j, t) {
	n = split(s, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ k = $2 SUBSEP $3; p[k] = p[k] " " $4; w[k] = w[k] " " $5; r[k] = r[k] " " sprintf("%.2f", $6) }
END {
	for (k in r) {
		split(k, mn, SUBSEP); split(mn[2], tk, "/")
		per = r[k]; gsub(/^ /, "", per)
		printf "| %s | %s, %s | %.0f / %.0f | %.2f | %s |\n", mn[1], tk[1], tk[2], median(p[k]) / 1000, median(w[k]) / 1000, median(r[k]), per
	}
}' "$out" | sort
