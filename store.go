package idempotency

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"
)

// Status is the state of a stored key.
type Status string

// The statuses a key moves through: in_flight when claimed, then completed
// (the response is recorded) or failed (the handler errored or panicked).
const (
	StatusInFlight  Status = "in_flight"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
)

// BodyKind says how a recorded response body is stored.
type BodyKind uint8

const (
	// BodyNone: no body recorded (over the route's response limit); a replay
	// answers 409 idempotency_response_not_stored.
	BodyNone BodyKind = iota
	// BodyJSON is a valid JSON document, stored as JSON (JSONB in Postgres) and
	// replayed as the same JSON value.
	BodyJSON
	// BodyRaw is any other body (empty, text, binary), replayed byte for byte.
	BodyRaw
)

// Fence identifies one ownership of a key: the row and the attempt that
// claimed it, on which every owner's change is conditional (Record.Fence).
type Fence struct {
	ID      int64 // the row's id
	Attempt int32 // the row's attempt when it was claimed; bumped by takeover
	// Scope, Key and Endpoint are the row's primary key: every fenced statement
	// finds the row by them (one shard on Citus); a Fence not matching owns
	// nothing.
	Scope    string
	Key      string
	Endpoint string
	wake     bool // with the outcome, wake the key's waiting duplicates (watcher)
}

// ClaimRequest is what the middleware asks a Store to claim.
type ClaimRequest struct {
	Key         string        // the route-parsed key: a lower-case UUID, or an opaque key exactly
	Scope       string        // user scope; "" means unscoped
	Endpoint    string        // the route's scope_endpoint
	RequestHash string        // 64 lower-case hex characters
	TTL, Grace  time.Duration // expires_at = now + TTL; retain_until = expires_at + Grace
	Lease       time.Duration // how long the claim owns the key: locked_until = now + Lease
	LockWait    time.Duration // bounds a transactional claim's wait on the key's row held by another transaction (0: DefaultTxLockWait)
	Owner       uuid.UUID     // the call's random token (uuid.Nil: none): a Claim finding its own in_flight row inside its lease reports it won; ReleaseOwner frees it
	DeriveKeyID string        // Config.DeriveKeys' active key id; a Takeover keeps a row's non-empty one
}

// Response is a handler's answer as recorded for replay.
type Response struct {
	Status   int         // the handler's status code
	Header   http.Header // replayable headers only
	Body     []byte      // the body; nil with BodyNone
	BodyKind BodyKind    // how Body is stored and replayed
	// SealKeyID, when set, names the key that sealed the response
	// (NewSealingStore): Body is then the sealed value, never replayed.
	SealKeyID string

	plaintext bool // read by a sealing store from a row recorded before sealing
}

// Record is one stored key as the store read it, Expired and LeaseOver by
// the store's own clock.
type Record struct {
	ID          int64     // the row's id, never reused
	Key         string    // the normalised idempotency key
	Scope       string    // the user scope; "" is unscoped
	Endpoint    string    // the route's scope_endpoint
	RequestHash string    // the hash of the request that claimed the key
	Status      Status    // in_flight, completed or failed
	Attempt     int32     // the fencing token: 1, plus one per takeover
	Response    Response  // Status is 0 while no response is recorded
	CreatedAt   time.Time // when the key was claimed (or taken over)
	LockedAt    time.Time // when the current owner claimed it
	LockedUntil time.Time // the current owner's lease end
	ExpiresAt   time.Time // after this the key may be taken over as new
	Expired     bool      // expires_at < now: the row may be taken over as a new key, unless
	Tombstone   bool      // expired, retain_until not (ExpiredRefuse): refused, never taken over
	LeaseOver   bool      // locked_until < now: an in_flight owner's lease has run out
	DeriveKeyID string    // ClaimRequest.DeriveKeyID of the claim that made the row
}

// Fence returns the fencing token of the ownership this record describes.
func (r Record) Fence() Fence {
	return Fence{ID: r.ID, Attempt: r.Attempt, Scope: r.Scope, Key: r.Key, Endpoint: r.Endpoint}
}

// ClaimResult is the outcome of a claim or a takeover.
type ClaimResult struct {
	Won    bool   // the caller owns the key (Record.Fence() is its token)
	Lost   bool   // a takeover lost its race: Won unset, Record zero
	Record Record // the claimed row; unless Won, the existing row (zero if Lost)
}

// ErasureResult reports what Erase did.
type ErasureResult struct {
	Deleted int64    // rows removed
	Skipped []Record // in_flight rows still inside their lease, left in place
}

// Store is where keys are claimed and responses recorded. Implementations
// must be safe for concurrent use; every method must honour ctx's deadline.
// Errors other than ErrNotOwner mean the store is unavailable: wrap them in
// a *StoreError so the middleware can log and label the reason.
type Store interface {
	// Claim inserts an in_flight row for req and returns it with Won set or,
	// when (Key, Scope, Endpoint) exists, returns that row unchanged with Won
	// unset. Won is set too for the caller's own claim (in_flight inside its
	// lease, holding non-zero req.Owner): a claim whose reply was lost goes on.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// Takeover turns the expired row f into a fresh in_flight claim of req
	// (new hash, TTL, lease; attempt+1; no response; DeriveKeyID kept), only
	// if the row still has f.Attempt, is expired, not in_flight in its lease.
	// Losing returns Lost set, Won unset and the zero Record.
	Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error)
	// Complete records resp and marks the row completed, only if f still owns
	// it in_flight, else ErrNotOwner. owner is the claim's record, which a
	// sealing store binds resp to.
	Complete(ctx context.Context, f Fence, owner Record, resp Response) error
	// Fail marks the row failed, only if f still owns it in_flight, else
	// ErrNotOwner.
	Fail(ctx context.Context, f Fence) error
	// Release deletes the row, only if f still owns it in_flight, else
	// ErrNotOwner.
	Release(ctx context.Context, f Fence) error
	Renew(ctx context.Context, f Fence, req ClaimRequest) error // req.Lease from now, only while f owns the row in_flight inside its lease with req.Owner's token, else ErrNotOwner
	// Cleanup purges the responses of at most limit tombstones and deletes at most limit rows
	// past retain_until, never an in_flight row inside its lease; it returns the rows changed.
	Cleanup(ctx context.Context, limit int) (int64, error)
	// Probe runs SELECT 1 on a new connection outside any pool: nil when the
	// database answered, a *StoreError with ReasonConnection only when it
	// could not be reached (a fail-open route's one cause to bypass).
	Probe(ctx context.Context) error
	// Erase deletes every row of the user scope except in_flight rows inside
	// their lease, which it reports (GDPR erasure).
	Erase(ctx context.Context, scope string) (ErasureResult, error)
	// ExportScope returns every row of the user scope, oldest first, with
	// recorded responses (GDPR access and portability).
	ExportScope(ctx context.Context, scope string) ([]Record, error)
	// ReleaseOwner deletes req's row only while it is in_flight with the
	// non-zero owner token req.Owner, and reports whether it did: it frees a
	// claim whose handler never ran.
	ReleaseOwner(ctx context.Context, req ClaimRequest) (bool, error)
	// Check verifies at start-up that the store can serve (its table, columns
	// and privileges): ErrSchemaOutdated or a *StoreError; nil when a store
	// has nothing to check.
	Check(ctx context.Context) error
}

// watcher is a store whose records can wake the duplicates waiting for
// them (RouteConfig.WaitInFlight): watch registers a waiter for row id;
// wake receives once an outcome recorded with Fence.wake may have landed
// (nil: never, poll); stop ends it. A store without it is polled.
type watcher interface {
	watch(id int64) (wake <-chan struct{}, stop func())
}

// watchRow is store's watch of row id, a nil channel for a store that
// cannot wake.
func watchRow(store Store, id int64) (<-chan struct{}, func()) {
	if w, ok := store.(watcher); ok {
		return w.watch(id)
	}
	return nil, func() {}
}

// TxStore is a Store that can back a transactional route: it claims a key
// inside the transaction the handler writes through, so the claim, the
// writes and the record commit together (PostgresStore, sqlstore.Store).
type TxStore interface {
	Store
	// BeginClaim begins a transaction and, when req is not nil, claims req's
	// key in it like Store.Claim, marking a savepoint once the key is owned.
	// A wait longer than req.LockWait on another transaction's row rolls
	// back and returns a nil RouteTx, Won unset. Otherwise the transaction
	// stays open, won or not (a loser may Takeover); the caller ends it.
	BeginClaim(ctx context.Context, req *ClaimRequest) (RouteTx, ClaimResult, error)
	// TxLockWaitBudget returns how long one claim with lock wait wait may
	// wait on locks, every try counted: a route whose budget reaches
	// Config.StoreTimeout is refused at construction.
	TxLockWaitBudget(wait time.Duration) time.Duration
}

// RouteTx is one transactional route's transaction, begun by
// TxStore.BeginClaim and used by one request at a time. Its errors, other
// than ErrNotOwner, are *StoreError.
type RouteTx interface {
	// Tx returns the transaction itself (a pgx.Tx for PostgresStore), for
	// tests; handlers get it through Lend.
	Tx() any
	// Lend returns ctx carrying the handler's view of the transaction
	// (TxFromContext for PostgresStore), whose Commit and Rollback are
	// refused (ErrTxManaged). Its function ends the loan: it waits for the
	// calls under way and refuses every later one.
	Lend(ctx context.Context) (context.Context, func())
	// State reports how the handler left the transaction.
	State() TxState
	// Takeover is Store.Takeover inside the transaction, waiting at most
	// req.LockWait on the row (running out loses); a win marks the savepoint.
	Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error)
	// Commit rolls back to the savepoint if s.Undo, checks the deferred
	// constraints (ErrDeferredConstraint), writes s's record fenced on
	// s.Fence, and commits; a nil s commits alone. After an error before
	// COMMIT the caller may Commit again with Undo and Failed; else Abort.
	Commit(ctx context.Context, s *Settlement) error
	// Abort rolls the whole transaction back, the claim included; called
	// again, or after the end, it changes nothing.
	Abort(ctx context.Context) error
	// EndLease, after Abort of a TxEnded transaction, ends the lease of f's
	// row now, fenced and only while in_flight, so a retry answers
	// idempotency_outcome_unknown; ErrNotOwner when nothing committed.
	EndLease(ctx context.Context, f Fence) error
}

// Settlement is the record a RouteTx commits: the claim's fence and the
// outcome to record.
type Settlement struct {
	Fence    Fence    // the claim that owns the record
	Owner    Record   // the claim's record, as Store.Complete's owner
	Failed   bool     // record failed instead of completed
	Undo     bool     // roll back to the savepoint first: the handler's writes vanish
	Response Response // what duplicates are answered with (completed only)
}

// ErrDeferredConstraint is returned (wrapped) by RouteTx.Commit when the
// handler's writes violate a deferred constraint.
var ErrDeferredConstraint = errors.New("idempotency: the handler's writes violate a deferred constraint")

// TxState is how a handler left its route's transaction.
type TxState int

const (
	// TxOpen: open, as the handler must leave it.
	TxOpen TxState = iota
	// TxAborted: a statement failed and the handler carried on; nothing more can
	// be written in it.
	TxAborted
	// TxEnded: the transaction ended under the handler, its connection alive
	// (the handler's COMMIT or ROLLBACK, or the server's rollback): the claim
	// may have committed; every later call gets ErrTxEnded.
	TxEnded
	// TxClosed: the connection closed (a statement ran past the handler's deadline
	// and pgx closed it, or the server ended the session): the server rolled
	// everything back, the claim included.
	TxClosed
)

// ErrNotOwner is returned by Complete, Fail and Release when the fence no
// longer matches (taken over, erased or finished): change nothing.
var ErrNotOwner = errors.New("idempotency: claim no longer owns the key")

// ErrStoreUnavailable matches (with errors.Is) every *StoreError: the store
// could not answer, so the route's fail-closed or fail-open policy applies.
var ErrStoreUnavailable = errors.New("idempotency: store unavailable")

// Reasons a store was unavailable, used in logs and metric labels.
const (
	ReasonTimeout            = "timeout"              // a sent statement got no reply before its deadline: a fail-open route probes, and bypasses only if the probe fails
	ReasonConnection         = "connection"           // the connection failed or was refused, or the server failed (SQLSTATE 53, 58, XX, 57P01-57P03): a fail-open route probes, as for timeout
	ReasonPoolExhausted      = "pool_exhausted"       // the call never got a pooled connection (every one in use, or the pool still opening one): 503, never a bypass
	ReasonStatementTimeout   = "statement_timeout"    // the server cancelled the statement (query_canceled; MySQL 1969, 3024): a lock wait or a slow statement, 503
	ReasonRemoteNode         = "remote_node"          // the server answered with SQLSTATE class 08: a node behind it (a Citus worker) failed or refused, 503
	ReasonTooManyConnections = "too_many_connections" // the database refused a connection: too many (53300)
	ReasonAuth               = "auth"                 // the database refused the login: role, password or database (class 28, 3D000)
	ReasonSchema             = "schema"               // the table, a column or a setting is missing, or a statement is unsupported (Citus): migrations not run
	ReasonPermission         = "permission"           // the database role lacks a privilege
	ReasonLockTimeout        = "lock_timeout"         // the call waited past lock_timeout (55P03): a table lock, DDL or a migration
	ReasonClosed             = "closed"               // the store or its pool was closed
	ReasonConflict           = "conflict"             // serialization failures persisted past the retries
	ReasonData               = "data"                 // the store refused the values themselves (e.g. a scope Postgres cannot hold): retrying cannot help
	ReasonFull               = "full"                 // a MemoryStore holds its MemoryMaxRows: a new key is refused on both policies, never bypassed
	ReasonSeal               = "seal"                 // a response could not be sealed: a record failure
	ReasonUnseal             = "unseal"               // a sealed response does not open: 503 on both policies
	ReasonOther              = "other"                // anything else
)

// StoreError is a store failure translated at the store boundary: the
// operation and a short reason for logs and metrics, never a driver type.
// errors.Is(err, ErrStoreUnavailable) holds for every *StoreError.
type StoreError struct {
	Op     string // claim, takeover, begin, commit, complete, fail, release, cleanup, erase, export
	Reason string // one of the Reason constants
	Err    error  // the underlying error
}

// Error describes the operation, the reason and the underlying error.
func (e *StoreError) Error() string {
	return "idempotency: store " + e.Op + " (" + e.Reason + "): " + e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *StoreError) Unwrap() error { return e.Err }

// Is reports whether target is ErrStoreUnavailable.
func (e *StoreError) Is(target error) bool { return target == ErrStoreUnavailable }

// storeOp returns the operation of a store error, "claim" when it names
// none.
func storeOp(err error) string {
	var se *StoreError
	if errors.As(err, &se) && se.Op != "" {
		return se.Op
	}
	return "claim"
}

// storeReason returns the reason label of a store error.
func storeReason(err error) string {
	var se *StoreError
	switch {
	case errors.As(err, &se):
		return se.Reason
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	default:
		return ReasonOther
	}
}
