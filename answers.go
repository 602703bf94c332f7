package idempotency

import (
	"net/http"
	"strconv"
)

// answer is one of the HTTP contract's own answers: every status, header
// and metric the middleware sends instead of the handler's response comes
// from the answers table through rq.answer.
type answer int

const (
	answerMissingKey answer = iota
	answerInvalidKey
	answerInvalidScope
	answerBodyTooLarge
	answerBodyUnreadable
	answerUnavailable
	answerInFlight
	answerMismatch
	answerPreviousFailed
	answerOutcomeUnknown
	answerNotStored
	answerResponseTooLarge
)

// counted names the counter an answer increments.
type counted int

const (
	countRejection counted = iota // idempotency_rejections_total{endpoint, reason}
	countConflict                 // idempotency_conflicts_total{endpoint, reason}
	countTooLarge                 // idempotency_response_too_large_total{endpoint}
)

// answers is the contract's table of answers (README "How it works").
var answers = [...]struct {
	status     int
	body       []byte
	retryAfter string // Retry-After, seconds; "" for none
	close      bool   // Connection: close: the request body was not read whole
	counter    counted
	reason     string
}{
	answerMissingKey:       {400, []byte(`{"error":"Idempotency-Key header is required"}`), "", false, countRejection, reasonMissingKey},
	answerInvalidKey:       {400, []byte(`{"error":"Idempotency-Key must be a UUID string"}`), "", false, countRejection, reasonInvalidKey},
	answerInvalidScope:     {400, []byte(`{"error":"idempotency_scope_invalid"}`), "", false, countRejection, reasonInvalidScope},
	answerBodyTooLarge:     {413, []byte(`{"error":"idempotency_body_too_large"}`), "", true, countRejection, reasonBodyTooLarge},
	answerBodyUnreadable:   {400, []byte(`{"error":"idempotency_body_unreadable"}`), "", true, countRejection, reasonBodyUnreadable},
	answerUnavailable:      {503, []byte(`{"error":"idempotency_store_unavailable"}`), "1", false, countRejection, reasonStoreUnavailable},
	answerInFlight:         {409, []byte(`{"error":"idempotency_in_flight","retry_after_ms":5000}`), "5", false, countConflict, reasonInFlight},
	answerMismatch:         {422, []byte(`{"error":"idempotency_key_body_mismatch"}`), "", false, countConflict, reasonBodyMismatch},
	answerPreviousFailed:   {409, []byte(`{"error":"idempotency_previous_failed"}`), "", false, countConflict, reasonPreviousFailed},
	answerOutcomeUnknown:   {409, []byte(`{"error":"idempotency_outcome_unknown"}`), "", false, countConflict, reasonOutcomeUnknown},
	answerNotStored:        {409, nil, "", false, countConflict, reasonNotStored}, // body: notStoredBody
	answerResponseTooLarge: {500, []byte(`{"error":"idempotency_response_too_large"}`), "", false, countTooLarge, ""},
}

// answer sends a and counts it.
func (rq *request) answer(a answer) { rq.answerWith(a, answers[a].body) }

// answerWith sends a with body and counts it.
func (rq *request) answerWith(a answer, body []byte) {
	ans := &answers[a]
	switch ans.counter {
	case countRejection:
		rq.m.metrics.rejections.WithLabelValues(rq.label, ans.reason).Inc()
	case countConflict:
		rq.m.metrics.conflicts.WithLabelValues(rq.label, ans.reason).Inc()
	case countTooLarge:
		rq.m.metrics.tooLarge.WithLabelValues(rq.label).Inc()
	}
	h := rq.w.Header()
	if ans.close {
		// The rest of the body stays unread: the connection cannot carry
		// another request.
		h.Set("Connection", "close")
	}
	if ans.retryAfter != "" {
		h.Set("Retry-After", ans.retryAfter)
	}
	writeJSON(rq.w, ans.status, body)
}

// writeJSON sends one of the contract's JSON answers.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// notStoredBody is answerNotStored's body, naming the original status.
func notStoredBody(original int) []byte {
	return []byte(`{"error":"idempotency_response_not_stored","original_status":` + strconv.Itoa(original) + `}`)
}

// answerDuplicate answers a request whose key belongs to a live record.
func (rq *request) answerDuplicate(rec Record) {
	switch {
	case rec.RequestHash != rq.claim.RequestHash:
		rq.answer(answerMismatch)
	case rec.Status == StatusCompleted && rec.Response.BodyKind == BodyNone:
		rq.answerWith(answerNotStored, notStoredBody(rec.Response.Status))
	case rec.Status == StatusCompleted:
		rq.replay(rec)
	case rec.Status == StatusFailed:
		rq.answer(answerPreviousFailed)
	case !rec.LeaseOver:
		rq.answer(answerInFlight)
	default:
		rq.m.log.Warn("idempotency: stale in-flight key, outcome unknown",
			"endpoint", rq.claim.Endpoint, "scope", rq.claim.Scope, "key", rq.claim.Key, "locked_at", rec.LockedAt)
		rq.answer(answerOutcomeUnknown)
	}
}
