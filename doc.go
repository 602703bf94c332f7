// Package idempotency makes HTTP write endpoints safe to retry.
//
// A client sends "Idempotency-Key: <uuid>". The middleware claims the key in
// a Store with one atomic insert-or-read, runs the wrapped handler at most
// once per (key, user scope, endpoint), records its response, and answers
// every duplicate with a replay of that response, a 409 or a 422. Each route
// chooses to fail closed (no store, no execution: 503) or fail open (no
// store, execute without deduplication).
//
// A request goes admit -> claim -> execute | answer: a request the
// middleware cannot check is refused (400, 413) before any claim; the
// request that wins the claim runs the handler, and its outcome is settled
// in the store before the response is sent; every other request gets the
// answer its key's Record calls for.
//
// The at-most-once boundary is the claim: once a key is claimed, its
// handler never runs again, whatever happens after (a crash, a lost
// connection, a store that cannot settle the outcome: such a key stays
// in flight and later answers idempotency_outcome_unknown). A route with
// Transactional set moves the boundary into the database: the key is
// claimed inside the transaction its handler writes through
// (TxFromContext), which commits together with the Record, so a process
// that dies mid-handler leaves nothing behind and the retry executes at
// once.
//
// Keys are UUIDs by default; a route may take opaque keys (KeyOpaque, as
// Stripe's clients send) or parse its own (RouteConfig.ParseKey). Error
// answers are fixed JSON, RFC 9457 problem+json (ErrorProblem) or the
// host's own (Config.ErrorWriter). Config.Observer sees every decision
// (contrib/otel turns it into OpenTelemetry spans and metrics), and
// Config.IdentifierSecret keeps user ids out of logs.
//
// The HTTP contract, the algorithm and the storage schema are described in
// the README; PostgresStore is the production store, MemoryStore serves a
// single process. A Store of your own can be checked with the conformance
// suite in package idempotencytest.
package idempotency
