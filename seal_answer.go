package idempotency

import (
	"errors"
)

// How the middleware answers a stored response that does not open: 503 on
// every policy, counted under the store-error reason unseal and logged at
// ERROR with the row's identity and key id. Never a miss (the handler
// would run a second time) and never a replay of the sealed bytes.

// refuseUnsealed answers a request whose key's row holds a response that
// did not open (err, from a sealing store's claim), or that a store which
// does not seal read sealed.
func (rq *request) refuseUnsealed(err error) {
	args := []any{"endpoint", rq.claim.Endpoint, "scope", rq.claim.Scope, "key", rq.claim.Key, "reason", ReasonUnseal}
	var ue *unsealError
	if errors.As(err, &ue) {
		args = append(args, "row_id", ue.id, "attempt", ue.attempt, "seal_key_id", ue.keyID, "error", ue.err)
	} else {
		args = append(args, "error", err)
	}
	rq.m.log.ErrorContext(rq.ctx, "idempotency: the key's stored response does not open; answering 503, never replaying it or running the handler again", args...)
	rq.cause = err
	rq.answer(answerUnavailable)
}

// refuseSealed answers a row read sealed by a store that does not seal:
// its bytes are ciphertext, not the response.
func (rq *request) refuseSealed(rec Record) {
	rq.m.metrics.storeErrors.WithLabelValues("claim", ReasonUnseal).Inc()
	rq.refuseUnsealed(&unsealError{id: rec.ID, attempt: rec.Attempt, keyID: rec.Response.SealKeyID, err: errSealedNotOpened})
}
