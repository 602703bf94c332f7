package idempotency

import (
	"net/http"
	"strconv"
	"time"
)

// answer is one of the HTTP contract's own answers: every status, header
// and metric the middleware sends instead of the handler's response comes
// from the answers table through rq.answer.
type answer int

const (
	answerMissingKey answer = iota
	answerInvalidKey
	answerInvalidOpaqueKey
	answerInvalidScope
	answerBodyTooLarge
	answerBodyUnreadable
	answerUnavailable
	answerInFlight
	answerMismatch
	answerKeyExpired
	answerPreviousFailed
	answerOutcomeUnknown
	answerNotStored
	answerResponseTooLarge
	answerLeaseLost
	numAnswers
)

// counted names the counter an answer increments.
type counted int

const (
	countRejection counted = iota // idempotency_rejections_total{endpoint, reason}
	countConflict                 // idempotency_conflicts_total{endpoint, reason}
	countTooLarge                 // idempotency_response_too_large_total{endpoint}
)

// answers is the contract's table of answers (README "How it works"), which
// each adapter maps to its transport: code is the HTTP body's "error"
// member; problem is the last segment of its problem+json type URI, an
// idempotency_... code either way, so a client finds the code in both
// forms; err is Do's error.
var answers = [numAnswers]struct {
	status       int
	code         string
	problem      string
	title        string
	retryAfter   string // Retry-After, seconds; "" for none
	retryAfterMS int    // the body's retry_after_ms; 0 for none
	close        bool   // Connection: close: the request body was not read whole
	counter      counted
	reason       string
	err          error // what the answer stands for, as Do and Exec return it (ErrorAnswer.Unwrap)
}{
	answerMissingKey:       {400, "Idempotency-Key header is required", "idempotency_key_required", "Idempotency-Key header is required", "", 0, false, countRejection, reasonMissingKey, ErrInvalidKey},
	answerInvalidKey:       {400, "Idempotency-Key must be a UUID string", "idempotency_key_invalid", "Idempotency-Key must be a UUID string", "", 0, false, countRejection, reasonInvalidKey, ErrInvalidKey},
	answerInvalidOpaqueKey: {400, "Idempotency-Key must be 1-255 characters", "idempotency_key_invalid", "Idempotency-Key must be 1-255 characters", "", 0, false, countRejection, reasonInvalidKey, ErrInvalidKey},
	answerInvalidScope:     {400, "idempotency_scope_invalid", "idempotency_scope_invalid", "The request's scope or endpoint cannot be stored", "", 0, false, countRejection, reasonInvalidScope, ErrInvalidScope},
	answerBodyTooLarge:     {413, "idempotency_body_too_large", "idempotency_body_too_large", "Request body over the route's limit", "", 0, true, countRejection, reasonBodyTooLarge, nil},
	answerBodyUnreadable:   {400, "idempotency_body_unreadable", "idempotency_body_unreadable", "Request body could not be read whole", "", 0, true, countRejection, reasonBodyUnreadable, nil},
	answerUnavailable:      {503, "idempotency_store_unavailable", "idempotency_store_unavailable", "Idempotency store unavailable; retry the same key", "1", 0, false, countRejection, reasonStoreUnavailable, ErrStoreUnavailable},
	answerInFlight:         {409, "idempotency_in_flight", "idempotency_in_flight", "A request with this key is in flight; retry the same key", "5", 5000, false, countConflict, reasonInFlight, ErrInFlight},
	answerMismatch:         {422, "idempotency_key_body_mismatch", "idempotency_key_body_mismatch", "Idempotency-Key was used for another request", "", 0, false, countConflict, reasonBodyMismatch, ErrMismatch},
	answerKeyExpired:       {422, "idempotency_key_expired", "idempotency_key_expired", "This key is past its lifetime; check the original's outcome before sending the operation again with a new key", "", 0, false, countConflict, reasonKeyExpired, ErrKeyExpired},
	answerPreviousFailed:   {409, "idempotency_previous_failed", "idempotency_previous_failed", "The first request with this key failed", "", 0, false, countConflict, reasonPreviousFailed, ErrPreviousFailed},
	answerOutcomeUnknown:   {409, "idempotency_outcome_unknown", "idempotency_outcome_unknown", "The first request with this key may or may not have run; reconcile", "", 0, false, countConflict, reasonOutcomeUnknown, ErrOutcomeUnknown},
	answerNotStored:        {409, "idempotency_response_not_stored", "idempotency_response_not_stored", "The first request completed; its response was too large to store", "", 0, false, countConflict, reasonNotStored, ErrResponseNotStored},
	answerLeaseLost:        {503, "idempotency_store_unavailable", "idempotency_store_unavailable", "Idempotency store unavailable; retry the same key", "1", 0, false, countRejection, reasonLeaseLost, ErrLeaseLost},
	answerResponseTooLarge: {500, "idempotency_response_too_large", "idempotency_response_too_large", "Response over the transactional route's buffer; rolled back", "", 0, false, countTooLarge, "", nil},
}

// ErrorFormat is the body form of the contract's error answers.
type ErrorFormat int

const (
	// ErrorJSON answers {"error":"<code>"} with Content-Type application/json,
	// plus the answer's extra members (retry_after_ms, original_status). The
	// default.
	ErrorJSON ErrorFormat = iota
	// ErrorProblem answers RFC 9457 application/problem+json: type, title,
	// status, and as extensions ErrorJSON's members.
	ErrorProblem
)

// ErrorAnswer is one of the contract's error answers: what
// Config.ErrorWriter receives, and the error (*ErrorAnswer) that Do and
// Operation.Exec return instead of running the function.
type ErrorAnswer struct {
	Status int // the contract's status: 400, 409, 413, 422, 500 or 503
	// Code is the "error" member of the default body: an idempotency_... code, or
	// for a missing or malformed key the contract's sentence.
	Code string
	// Kind is the answer's stable machine code, the one adapters map:
	// idempotency_in_flight, idempotency_key_required, and so on.
	Kind string
	// Type is the problem type URI: Config.ProblemTypeBase and Kind.
	Type           string
	Title          string    // a short human-readable summary
	RetryAfterMS   int       // 5000 on idempotency_in_flight, else 0
	OriginalStatus int       // the recorded status on idempotency_response_not_stored, else 0
	Expires        time.Time // the key's expires_at, to the second, on an answer about its row; else zero

	err error // what it stands for (Unwrap)
}

// JSON returns the default body of e: {"error":...} and its extra members.
func (e ErrorAnswer) JSON() []byte {
	b := append([]byte(`{"error":`), strconv.Quote(e.Code)...)
	return e.appendExtra(b)
}

// Problem returns the RFC 9457 body of e.
func (e ErrorAnswer) Problem() []byte {
	b := append([]byte(`{"type":`), strconv.Quote(e.Type)...)
	b = append(b, `,"title":`...)
	b = append(b, strconv.Quote(e.Title)...)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(e.Status), 10)
	b = append(b, `,"error":`...)
	b = append(b, strconv.Quote(e.Code)...)
	return e.appendExtra(b)
}

// appendExtra closes a body with the answer's extra members. The table's
// strings are plain ASCII, so strconv.Quote writes valid JSON strings.
func (e ErrorAnswer) appendExtra(b []byte) []byte {
	if e.RetryAfterMS != 0 {
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, int64(e.RetryAfterMS), 10)
	}
	if e.OriginalStatus != 0 {
		b = append(b, `,"original_status":`...)
		b = strconv.AppendInt(b, int64(e.OriginalStatus), 10)
	}
	return append(b, '}')
}

// errorAnswer returns answer a as an ErrorAnswer under the middleware's
// problem type base.
func (m *Middleware) errorAnswer(a answer, original int) ErrorAnswer {
	ans := &answers[a]
	return ErrorAnswer{Status: ans.status, Code: ans.code, Kind: ans.problem, Type: m.cfg.ProblemTypeBase + ans.problem,
		Title: ans.title, RetryAfterMS: ans.retryAfterMS, OriginalStatus: original}
}

// errorBodies renders every answer's body once, in the configured format,
// so answering costs no encoding (answerNotStored names a status per
// request and is rendered then).
func (m *Middleware) errorBodies() {
	for a := range numAnswers {
		m.bodies[a] = m.render(m.errorAnswer(a, 0))
	}
}

// render returns the body of e in the configured format.
func (m *Middleware) render(e ErrorAnswer) []byte {
	if m.cfg.ErrorFormat == ErrorProblem {
		return e.Problem()
	}
	return e.JSON()
}

// answer counts a and has the adapter deliver it.
func (rq *request) answer(a answer) { rq.answerWith(a, 0) }

// answerWith counts answer a, reports it, and has the adapter deliver it
// (naming the original status of answerNotStored): the only way the
// contract's answers reach a caller.
func (rq *request) answerWith(a answer, original int) {
	ans := &answers[a]
	switch ans.counter {
	case countRejection:
		rq.m.metrics.rejections.WithLabelValues(rq.label, ans.reason).Inc()
	case countConflict:
		rq.m.metrics.conflicts.WithLabelValues(rq.label, ans.reason).Inc()
	case countTooLarge:
		rq.m.metrics.tooLarge.WithLabelValues(rq.label).Inc()
	}
	rq.observeAnswer(a)
	rq.t.deliver(a, original)
}

// advertised is the expiry answer a tells (Idempotency-Expires, CallInfo,
// ErrorAnswer.Expires): the expires_at of the row the call read or wrote,
// to the second, on the answers about that row (the conflicts: 409 and
// 422); zero on the others (400, 413, 500, 503) and without a row (a
// contention 409, a transactional 409 in flight). The handler's own
// result and a replay advertise the row's always (advertise).
func (rq *request) advertised(a answer) time.Time {
	if answers[a].counter != countConflict {
		return time.Time{}
	}
	return advertise(rq.expires)
}

// advertise is expires_at as it is advertised: rounded down to the
// second (zero stays zero).
func advertise(expires time.Time) time.Time {
	if expires.IsZero() {
		return time.Time{}
	}
	return expires.UTC().Truncate(time.Second)
}

// expiresHeader sets Idempotency-Expires on h to t as an IMF-fixdate,
// unless t is zero.
func expiresHeader(h http.Header, t time.Time) {
	if !t.IsZero() {
		h[HeaderExpires] = []string{t.Format(http.TimeFormat)} // canonical: Header.Set without its canonicalisation
	}
}

// answerDuplicate answers a request whose key belongs to a live record.
func (rq *request) answerDuplicate(rec Record) {
	switch {
	case tombstone(rec): // before the hash: the same body and another one alike
		rq.answer(answerKeyExpired)
	case rec.Response.SealKeyID != "":
		rq.refuseSealed(rec)
	case rec.RequestHash != rq.claim.RequestHash:
		rq.answer(answerMismatch)
	case rec.Status == StatusCompleted && rec.Response.BodyKind == BodyNone:
		rq.answerWith(answerNotStored, rec.Response.Status)
	case rec.Status == StatusCompleted:
		rq.replay(rec)
	case rec.Status == StatusFailed:
		rq.answer(answerPreviousFailed)
	case !rec.LeaseOver:
		rq.answer(answerInFlight)
	case rq.reconcile(rec):
	default:
		rq.m.log.WarnContext(rq.ctx, "idempotency: stale in-flight key, outcome unknown",
			"endpoint", rq.claim.Endpoint, "scope", rq.claim.Scope, "key", rq.claim.Key, "locked_at", rec.LockedAt)
		rq.answer(answerOutcomeUnknown)
	}
}
