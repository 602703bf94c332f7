# Run `make` (or `make help`) to list the targets.
.DEFAULT_GOAL := help
GO ?= go
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_/.-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}'

# Every module of the repository: the root, bench/ and each contrib/* (go test
# ./... does not enter nested modules).
MODULES := $(patsubst %/go.mod,%,$(shell find . -name go.mod -not -path '*/testdata/*' | sort))

.PHONY: test
test: ## go vet, then every test with the race detector, in every module (Postgres tests need IDEMPOTENCY_TEST_DATABASE_URL or Docker)
	@skips=$$(mktemp); status=0; \
	for m in $(MODULES); do \
		echo "== $$m"; \
		(cd $$m && $(GO) vet ./... && IDEMPOTENCY_TEST_SKIP_LOG="$$skips" $(GO) test -race -count=1 -timeout 15m ./...) || { status=1; break; }; \
	done; \
	$(SKIP_SUMMARY) "$$skips" | sort; rm -f "$$skips"; exit $$status

# go test prints a passing package's skips only with -v, so internal/testdb
# notes each test skipped for want of a database in the file
# IDEMPOTENCY_TEST_SKIP_LOG names, and make test sums them up: one line per
# package and reason.
SKIP_SUMMARY = awk -F '\t' -v root='$(CURDIR)' '{ n[$$0]++ } END { for (k in n) { split(k, f, "\t"); d = f[1]; \
	if (index(d, root) == 1) d = "." substr(d, length(root) + 1); \
	printf "SKIPPED %d test(s) in %s: %s\n", n[k], d, f[2] } }'

.PHONY: test/short
test/short: ## Fast tests only, without the race detector
	$(GO) test -short -count=1 ./...

.PHONY: test/pg
test/pg: ## make test against the local Postgres (TEST_DATABASE_URL, default 127.0.0.1:5432), failing instead of skipping without it
	IDEMPOTENCY_TEST_DATABASE_URL='$(TEST_DATABASE_URL)' IDEMPOTENCY_REQUIRE_DB=1 $(MAKE) test

.PHONY: test/failover
test/failover: ## Kill -9 the Patroni leader under load (needs the patroni, etcd-server and postgresql packages; about a minute)
	$(GO) test -tags failover -count=1 -timeout 4m -v -run TestFailover ./internal/failover

.PHONY: test/matrix
test/matrix: ## The fault matrix: every fault x entry point x store x route policy, printed with N/A reasons and wall time (MATRIX_PARALLEL cells at once, default 4; a few minutes)
	cd internal/matrix && $(GO) test -tags matrix -count=1 -timeout 25m -parallel 64 -run '^TestMatrix$$'

.PHONY: bench
bench: ## Go benchmarks with allocations (Postgres ones need IDEMPOTENCY_TEST_DATABASE_URL)
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./...

.PHONY: bench/once
bench/once: ## Every Go benchmark once (-benchtime 1x), as CI runs them, so a broken benchmark fails the build
	$(GO) test -run '^$$' -bench . -benchtime 1x -count=1 ./...
	cd bench && $(GO) test -run '^$$' -bench . -benchtime 1x -count=1 ./...
	BLOCKS=1 BENCHTIME=1x bash bench/rpc.sh

.PHONY: bench/rpc
bench/rpc: ## gRPC and Connect interceptors against the same no-op without them, beside the HTTP middleware, 16 clients on Postgres, side by side (about 4 minutes)
	bash bench/rpc.sh

.PHONY: bench/ablation
bench/ablation: ## pgbench ablation of the storage schema (#27): every candidate interleaved, synchronous_commit on and off, medians (REPS=3 T=8; bash bench/ablation.sh)
	bash bench/ablation.sh

.PHONY: bench/load
bench/load: ## Load benchmark of the example server on the local Postgres (DATABASE_URL); writes BENCHMARKS.md and bench/chart.svg (bash bench/load.sh -quick: ~1 min)
	bash bench/load.sh

.PHONY: bench/retention
bench/retention: ## Cleanup at 30 days of retention (issue #36): ROWS (default 50 million) rows over 30 days in a database of its own, sizes, cleanup while pgbench inserts, the 30-day size computed (ROWS=5000000: ~15 minutes)
	bash bench/retention.sh

.PHONY: bench/load/seal
bench/load/seal: ## Load benchmark of sealing off against on (issue #26): A and N, interleaved; prints a Markdown table (about 7 minutes)
	bash bench/load.sh -seal

.PHONY: bench/groupcommit
bench/groupcommit: ## Group commit's targets (issue #37) in one interleaved run: N new keys at 1/16/64 clients, replays, A, before/after, against the narrow-table and hot-select floors (REFS="BEFORE AFTER", default main~ HEAD; BEFORE_ENV, AFTER_ENV: each side's servers' environment, e.g. GOMAXPROCS=1)
	bash bench/groupcommit.sh $(REFS)

.PHONY: bench/beforeafter
bench/beforeafter: ## A and N built from two git refs, interleaved in one run: make bench/beforeafter REFS="BEFORE AFTER" (DATABASE_URL as bench/load)
	@test -n "$(REFS)" || { echo 'usage: make bench/beforeafter REFS="BEFORE_REF AFTER_REF"'; exit 2; }
	bash bench/beforeafter.sh $(REFS)

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	@set -e; for m in $(MODULES); do \
		echo "== $$m"; \
		(cd $$m && $(GO) vet ./... && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...); \
	done
	$(GO) vet -tags failover ./internal/failover && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags failover ./internal/failover
	cd internal/matrix && $(GO) vet -tags matrix . && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags matrix .

.PHONY: release/check
release/check: ## Build every module's zip as the proxy would serve it at HEAD; fail on an executable or a zip over 2 MiB
	cd bench && $(GO) run ./cmd/releasecheck ..

.PHONY: tidy
tidy: ## go mod tidy in every module
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) mod tidy); done

.PHONY: example
example: ## Run the example paper-trading server (in memory; set DATABASE_URL for Postgres)
	$(GO) run ./examples/server

.PHONY: fuzz
fuzz: ## Fuzz the request-hash canonicaliser for a minute
	$(GO) test -run '^$$' -fuzz FuzzCanonical -fuzztime 60s ./internal/jcs

.PHONY: db/reset/test
db/reset/test: ## Drop the test schemas a crashed test run may have left in the database at TEST_DATABASE_URL
	psql '$(TEST_DATABASE_URL)' -Atc "SELECT 'DROP SCHEMA ' || quote_ident(nspname) || ' CASCADE;' FROM pg_namespace WHERE nspname LIKE 'idem_test_%'" | psql '$(TEST_DATABASE_URL)' -q
