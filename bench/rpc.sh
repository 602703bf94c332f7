#!/usr/bin/env bash
# The gRPC and Connect interceptors' cost on a no-op unary method, beside
# the HTTP middleware's on the same no-op, in one run (issue #24):
# BenchmarkUnary of contrib/grpc and contrib/connect, 16 clients, on the
# PostgreSQL of IDEMPOTENCY_TEST_DATABASE_URL. Each module's run holds its
# RPC points and the HTTP ones (plain = the same no-op without the
# middleware); a block runs both modules, in an order that alternates from
# block to block. A ratio is throughput with the middleware over
# throughput without it (ns/op plain / ns/op keyed) within one module's
# run, and the table shows the median over the blocks with each block's.
#
#   bash bench/rpc.sh            # 3 blocks of 2s points
#   BLOCKS=5 BENCHTIME=3s bash bench/rpc.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${IDEMPOTENCY_TEST_DATABASE_URL:=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}"
export IDEMPOTENCY_TEST_DATABASE_URL IDEMPOTENCY_REQUIRE_DB=1 GOWORK=off
BLOCKS=${BLOCKS:-3}
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
			awk -v blk="$blk" -v mod="$mod" '/^BenchmarkUnary\//{name=$1; sub(/^BenchmarkUnary\//, "", name); sub(/-[0-9]+$/, "", name); print blk, mod, name, $3}' >>"$out"
		grep -q "^$blk $mod " "$out" || { echo "bench/rpc.sh: $mod produced no result in block $blk" >&2; exit 1; }
	done
done
echo "blocks: $BLOCKS, benchtime: $BENCHTIME, $(nproc) cores, started $started, ended $(date -u '+%H:%M UTC'), load average at the start $load0, at the end $(cut -d' ' -f1 /proc/loadavg), commit $(git rev-parse --short HEAD)"
echo
echo "| module | transport | ns/op plain / new keys / replays (medians) | new keys / plain, per block | replays / plain, per block |"
echo "|---|---|--:|---|---|"
awk '
function median(s,   a, n, i, j, t) {
	n = split(s, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ split($3, p, "/"); ns[$1, $2, p[1], p[2]] = $4; tr[$2 SUBSEP p[1]] = 1; if ($1 > nb) nb = $1 }
END {
	for (k in tr) {
		split(k, mt, SUBSEP); m = mt[1]; t = mt[2]
		plains = ""; nks = ""; rps = ""; nk = ""; rp = ""
		for (b = 1; b <= nb; b++) {
			pl = ns[b, m, t, "plain"]
			plains = plains " " pl; nks = nks " " ns[b, m, t, "new_keys"]; rps = rps " " ns[b, m, t, "replays"]
			nk = nk " " sprintf("%.2f", pl / ns[b, m, t, "new_keys"])
			rp = rp " " sprintf("%.2f", pl / ns[b, m, t, "replays"])
		}
		gsub(/^ /, "", nk); gsub(/^ /, "", rp)
		printf "| %s | %s | %d / %d / %d | %.2f (%s) | %.2f (%s) |\n", m, t, median(plains), median(nks), median(rps), median(nk), nk, median(rp), rp
	}
}' "$out" | sort
