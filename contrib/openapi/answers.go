package idemopenapi

import (
	"math"
	"net/http"
	"strconv"

	"github.com/idemkit/idempotency"
)

// answer is one of the contract's error answers as a route can send it
// (README "How it works", DESIGN "HTTP contract"): its status, its "error"
// member, and the headers it carries. The root package keeps its own table
// unexported; TestAnswersMatchTheMiddleware drives a real Middleware into
// each answer and validates it against what this table declares.
type answer struct {
	status     int
	code       string
	retryAfter bool // sends Retry-After
	retryMS    bool // the body has retry_after_ms
	original   bool // the body has original_status
}

// The 400 sentences of a missing or refused key.
const (
	codeKeyRequired      = "Idempotency-Key header is required"
	codeKeyNotUUID       = "Idempotency-Key must be a UUID string"
	codeKeyOpaqueInvalid = "Idempotency-Key must be 1-255 characters"
)

// routeAnswers returns the error answers route rc sends, in status order.
func routeAnswers(rc idempotency.RouteConfig) []answer {
	var as []answer
	if rc.RequireKey {
		as = append(as, answer{status: 400, code: codeKeyRequired})
	}
	if rc.KeyFormat == idempotency.KeyOpaque || rc.ParseKey != nil {
		as = append(as, answer{status: 400, code: codeKeyOpaqueInvalid})
	} else {
		as = append(as, answer{status: 400, code: codeKeyNotUUID})
	}
	as = append(as,
		answer{status: 400, code: "idempotency_scope_invalid"},
		answer{status: 400, code: "idempotency_body_unreadable"},
		answer{status: 409, code: "idempotency_in_flight", retryAfter: true, retryMS: true},
		answer{status: 409, code: "idempotency_previous_failed"},
		answer{status: 409, code: "idempotency_outcome_unknown"},
		answer{status: 409, code: "idempotency_response_not_stored", original: true},
	)
	if rc.MaxBodyBytes != math.MaxInt64 { // math.MaxInt64: no limit but memory
		as = append(as, answer{status: 413, code: "idempotency_body_too_large"})
	}
	as = append(as, answer{status: 422, code: "idempotency_key_body_mismatch"})
	if rc.Expired == idempotency.ExpiredRefuse {
		as = append(as, answer{status: 422, code: "idempotency_key_expired"})
	}
	if rc.Transactional {
		as = append(as, answer{status: 500, code: "idempotency_response_too_large"})
	}
	return append(as, answer{status: 503, code: "idempotency_store_unavailable", retryAfter: true})
}

// statusGroup is the answers of one status code.
type statusGroup struct {
	status  int
	answers []answer
}

// byStatus groups as, which routeAnswers returns in status order.
func byStatus(as []answer) []statusGroup {
	var gs []statusGroup
	for _, a := range as {
		if n := len(gs); n > 0 && gs[n-1].status == a.status {
			gs[n-1].answers = append(gs[n-1].answers, a)
			continue
		}
		gs = append(gs, statusGroup{status: a.status, answers: []answer{a}})
	}
	return gs
}

// key is the response key of the group's status ("409").
func (g statusGroup) key() string { return strconv.Itoa(g.status) }

// codes returns the "error" members of the group.
func (g statusGroup) codes() []any {
	cs := make([]any, len(g.answers))
	for i, a := range g.answers {
		cs[i] = a.code
	}
	return cs
}

// has reports whether some answer of the group has the property p.
func (g statusGroup) has(p func(answer) bool) bool {
	for _, a := range g.answers {
		if p(a) {
			return true
		}
	}
	return false
}

// every reports whether every answer of the group has the property p.
func (g statusGroup) every(p func(answer) bool) bool {
	for _, a := range g.answers {
		if !p(a) {
			return false
		}
	}
	return true
}

// description says what the group's answers mean to a client.
func (g statusGroup) description(rc idempotency.RouteConfig) string {
	switch g.status {
	case 400:
		key := "malformed"
		if rc.RequireKey {
			key = "missing or malformed"
		}
		return "Idempotency: the Idempotency-Key is " + key + ", the request's scope cannot be stored, or the body could not be read whole. Nothing was stored and the handler did not run; fix the request."
	case 409:
		return "Idempotency: idempotency_in_flight (the first request is still running: retry the same key after Retry-After), idempotency_previous_failed (the first attempt failed with a 5xx: the key is spent; check state, then use a new key), idempotency_outcome_unknown (the first attempt may or may not have run: reconcile before anything else, never retry with a new key) or idempotency_response_not_stored (it completed with original_status, but its response was too large to keep: fetch the resource instead)."
	case 413:
		return "Idempotency: the request body is over the route's limit (" + limitText(rc.MaxBodyBytes) + "). Nothing was stored and the handler did not run."
	case 422:
		mismatch := "this Idempotency-Key was used for a different request (another body, path or query). Use a new key for a new request."
		if rc.Expired != idempotency.ExpiredRefuse {
			return "Idempotency: " + mismatch
		}
		return "Idempotency: idempotency_key_body_mismatch, " + mismatch + " Or idempotency_key_expired, this key is past its lifetime (Idempotency-Expires) and kept as a tombstone: nothing ran; check the original's outcome before sending the operation again with a new key."
	case 500:
		return "Idempotency: idempotency_response_too_large, the response was over the transactional route's buffer: its writes rolled back and the key is failed (the same key answers idempotency_previous_failed; check state, then use a new key)."
	case 503:
		s := "Idempotency: idempotency_store_unavailable, the idempotency store could not decide and the handler did not run."
		if rc.Transactional {
			s = "Idempotency: idempotency_store_unavailable, the idempotency store could not decide: usually nothing ran, but when the transaction's commit failed (or its reply was lost) the handler ran and whether it committed is unknown."
		}
		s += " Always retry the same key after Retry-After (it replays what committed, executes what did not), never a new key."
		if rc.FailOpen {
			s += " This route fails open: while the database is down it runs without deduplication instead, so this answer means a saturated pool, a full store or a misconfiguration."
		}
		return s
	}
	return http.StatusText(g.status)
}

// limitText writes a body limit for people.
func limitText(n int64) string {
	if n == 0 {
		n = idempotency.DefaultMaxBodyBytes
	}
	if n%(1<<20) == 0 {
		return strconv.FormatInt(n>>20, 10) + " MiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}
