// Package idempotency makes write endpoints safe to retry: HTTP routes, and
// through Do any function, such as a queue consumer, a webhook or a job.
//
// A client sends "Idempotency-Key: <uuid>". The middleware claims the key in
// a Store with one atomic insert-or-read, runs the wrapped handler at most
// once per (key, user scope, endpoint), records its response before sending
// it, and answers every duplicate with a replay of that response, a 409 or a
// 422. Each route fails closed (no store, no execution: 503) or open (no
// store: run without deduplication). Do gives a function the same contract:
// its result is recorded and replayed, and the contract's other answers are
// errors (*ErrorAnswer, matched with errors.Is to ErrInFlight and the rest).
//
// The at-most-once boundary is the claim: once a key is claimed, its handler
// never runs again, whatever happens after (a key whose outcome cannot be
// recorded stays in flight and answers idempotency_outcome_unknown). A
// Transactional route or Operation moves the boundary into the database: the
// key is claimed inside the transaction the handler writes through
// (TxFromContext), which commits together with the record, so a process that
// dies mid-handler leaves nothing behind and the retry executes at once.
//
// # The module
//
//   - this package: the middleware (New, Route, Operation, Do) and two
//     stores, PostgresStore (pgx, the files store_pg*.go) and MemoryStore
//     (one process);
//   - sqlstore: a TxStore on database/sql, for MySQL/MariaDB or PostgreSQL;
//   - idempotencytest: the conformance kit every Store passes;
//   - idemclient: a client that sends keys and retries safely;
//   - idemrpc: what the gRPC and Connect adapters share;
//   - downstream: ids derived from a call's key for the systems it calls;
//   - migrations: the schema, embedded, and its runner;
//   - contrib/*: a module per framework, router or RPC stack (chi, echo,
//     gin, gorilla, grpc, connect, sqlx, gorm, bun, otel);
//   - cmd/idempotency: the operator CLI (migrate, inspect, release, cleanup,
//     erase, export, stats, reseal);
//   - internal: what no user depends on (the shared SQL in internal/pgsql,
//     the error classes in internal/sqlstate, the test helpers).
//
// The README describes the HTTP contract, the algorithm and the schema.
package idempotency
