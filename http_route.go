package idempotency

import (
	"context"
	"errors"
	"net/http"
)

// The HTTP adapter's admission: the kill-switch, the Idempotency-Key
// header, the body and the scope make a request into the engine's call,
// which serve then takes its way.

// ServeHTTP takes one request through the route: admit it (the kill-switch,
// the key, the body, the scope), then serve it: claim its key, execute the
// handler if the claim was won, or answer as the key's record calls for.
func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if answerProbe(w, r) { // coverage.go: the wrapper is here; nothing more
		return
	}
	if rt.plain && len(r.Header[HeaderKey]) == 0 {
		rt.passKeyless(w, r)
		return
	}
	rq := rt.newRequest(w, r)
	if !rq.admit() {
		return
	}
	rq.serve()
}

// passKeyless passes a request without a key through a plain route (no
// transaction, no Observer, the key optional) without building the
// engine's call: what admit would do, at the cost of a bare handler. A
// kill-switch that is off is counted as admit counts it.
func (rt *route) passKeyless(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if rt.m.ownSwitch {
		ctx = context.WithValue(ctx, requestCtxKey, r)
	}
	if rt.m.cfg.Enabled(ctx) {
		rt.next.ServeHTTP(w, r)
		return
	}
	rq := rt.newRequest(w, r)
	rq.name()
	rq.switchedOff()
}

// admit decides whether a request is claimed. It reports false when it has
// already dealt with the request: passed it through (kill-switch off, no
// key on an optional route) or refused it (400, 413).
func (rq *httpRequest) admit() bool {
	if !rq.m.cfg.Enabled(rq.hookContext(rq.m.ownSwitch)) {
		rq.name()
		rq.switchedOff()
		return false
	}
	key, present, ok := headerKey(rq.r, rq.rt.parseKey)
	if !present && !rq.rt.requireKey {
		if rq.m.cfg.Observer != nil || rq.rt.txStore != nil {
			rq.name()
			rq.observeUnrun(OutcomePassThrough, "")
		}
		rq.passThrough()
		return false
	}
	rq.name()
	switch {
	case !present:
		rq.answer(answerMissingKey)
		return false
	case !ok:
		rq.answer(rq.rt.invalidKey)
		return false
	}
	body, err := readBody(rq.w, rq.r, rq.rt.maxBody, rq.m.cfg.BodyTimeout)
	switch {
	case errors.Is(err, errBodyTooLarge):
		rq.answer(answerBodyTooLarge)
		return false
	case err != nil:
		rq.answer(answerBodyUnreadable)
		return false
	}
	return rq.admitScope(key, body)
}

// admitScope builds the claim of a keyed request whose body was read
// (admitClaim), under the scope Config.Scope gives.
func (rq *httpRequest) admitScope(key string, body []byte) bool {
	scope := rq.m.cfg.Scope(rq.hookContext(rq.m.scoped))
	return rq.admitClaim(key, scope, requestHash(rq.r.Method, rq.r.URL.EscapedPath(), rq.r.URL.RawQuery, body), rq.rt.needScope)
}
