package idempotency

import "errors"

// The contract's answers to a call whose function did not run, as Do
// returns them: each is what an *ErrorAnswer unwraps to, matched with
// errors.Is (ErrInvalidKey and ErrStoreUnavailable are the key's and the
// store's). The comment gives the HTTP contract's status and code.
var (
	ErrInFlight                = errors.New("idempotency: a call with this key is in flight")                                                       // 409 idempotency_in_flight: retry the same key after RetryAfterMS
	ErrMismatch                = errors.New("idempotency: the key was used for another request")                                                    // 422 idempotency_key_body_mismatch
	ErrPreviousFailed          = errors.New("idempotency: the first call with this key failed")                                                     // 409 idempotency_previous_failed
	ErrOutcomeUnknown          = errors.New("idempotency: the first call with this key may or may not have run")                                    // 409 idempotency_outcome_unknown: reconcile, never retry with a new key
	ErrResponseNotStored       = errors.New("idempotency: the first call with this key completed; its result was not stored")                       // 409 idempotency_response_not_stored
	ErrInvalidScope            = errors.New("idempotency: the scope or endpoint cannot be stored")                                                  // 400 idempotency_scope_invalid
	ErrUnsettled               = errors.New("idempotency: the call's downstream outcome is unknown")                                                // a function's error wraps it like Unsettled: 503, the retry reconciles
	ErrNotDone                 = errors.New("idempotency: the downstream has no trace of the call")                                                 // a Reconcile hook's "not done": the handler runs
	ErrKeyExpired              = errors.New("idempotency: the key is past its lifetime")                                                            // 422 idempotency_key_expired: check the original's outcome first
	ErrLeaseLost         error = &StoreError{Op: "renew", Reason: "lease_lost", Err: errors.New("the key's lease was lost while its function ran")} // 503 idempotency_store_unavailable (a StoreError): a Heartbeat call was cancelled, nothing recorded
)

// ErrTxEnded is returned by every call of a lent transaction
// (TxFromContext) once it ended under the handler (its own COMMIT or
// ROLLBACK, or the server's rollback): nothing more is sent, and the client
// gets 503 idempotency_store_unavailable.
var ErrTxEnded = errors.New("idempotency: the route's transaction ended under the handler")

// Error describes the answer, as Do and the RPC adapters return it: what it
// stands for, and its Kind (never the HTTP header's sentence: outside HTTP
// the key is no header).
func (e ErrorAnswer) Error() string {
	if e.err == nil {
		return "idempotency: " + e.Kind
	}
	return e.err.Error() + " (" + e.Kind + ")"
}

// Unwrap returns the error the answer stands for: one of the errors above,
// ErrInvalidKey, or for a store that could not answer its *StoreError (or
// ErrStoreUnavailable).
func (e ErrorAnswer) Unwrap() error { return e.err }

// PermanentError is a business rejection returned by a function of Do: it
// completes the call, as a 4xx does over HTTP (a transactional Operation's
// writes commit), and every retry gets the same *PermanentError back.
type PermanentError struct {
	Code    string // for programs, e.g. "insufficient_funds"
	Message string // for people
}

// Error returns the code and the message.
func (e *PermanentError) Error() string { return e.Code + ": " + e.Message }

// Retryable marks err, returned by a function of Do, as retryable: the key
// is released, as a 429 releases it over HTTP, so a retry with the key runs
// the function again. Do returns it as a *RetryableError holding err (a
// consumer nacks on errors.Is(err, ErrRetryable)). Retryable(nil) is nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &RetryableError{Err: err}
}

// ErrRetryable matches (with errors.Is) every *RetryableError: the
// function's call was not completed and its key was released, so a retry
// with the same key runs the function again.
var ErrRetryable = errors.New("idempotency: the call may be retried with the same key")

// RetryableError is a function's error marked by Retryable, as Do returns
// it. It unwraps to the function's error Err.
type RetryableError struct {
	Err error // the function's error
}

// Error returns Err's message.
func (e *RetryableError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *RetryableError) Unwrap() error { return e.Err }

// Is reports whether target is ErrRetryable.
func (e *RetryableError) Is(target error) bool { return target == ErrRetryable }
