package main

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idempotency"
)

// plans are the plans a checkout session can be for.
var plans = []string{"basic", "pro", "team"}

// checkoutSession is a fake provider's checkout session.
type checkoutSession struct {
	ID        string    `json:"id"`
	Plan      string    `json:"plan"`
	Status    string    `json:"status"`
	URL       string    `json:"url"`
	CreatedAt time.Time `json:"created_at"`
}

// Retention of the fake billing provider's checkout sessions.
const (
	// billingRetention is how long a checkout session (and the
	// idempotency key that created it) is kept: the billing route's TTL,
	// so the upstream deduplication covers every key the middleware may
	// still remember.
	billingRetention = billingTTL
	// billingMaxSessions bounds the sessions kept, all users together;
	// past it the oldest go first.
	billingMaxSessions = 100_000
)

// fakeBilling stands in for a billing provider such as Stripe. It lives in
// the process's memory, so billing keeps working while the database is
// down, and like Stripe it deduplicates on the caller's idempotency key:
// that upstream protection is why the billing route may fail open.
// Sessions are kept for billingRetention, at most billingMaxSessions of
// them (the oldest go first), so the fake's memory stays bounded.
type fakeBilling struct {
	retention   time.Duration
	maxSessions int
	now         func() time.Time // monotonic clock for retention; tests set it

	mu       sync.Mutex
	sessions map[int64][]checkoutSession
	byKey    map[billingKey]checkoutSession
	created  []billingCreated // every kept session, oldest first
}

type billingKey struct {
	user int64
	key  string
}

// billingCreated records when a kept session was created, for pruning.
type billingCreated struct {
	billingKey           // its user and idempotency key ("" without one)
	id         string    // the session's id
	at         time.Time // creation time, with its monotonic reading
}

func newFakeBilling() *fakeBilling {
	return &fakeBilling{
		retention: billingRetention, maxSessions: billingMaxSessions, now: time.Now,
		sessions: map[int64][]checkoutSession{}, byKey: map[billingKey]checkoutSession{},
	}
}

// prune drops the sessions past their retention, then the oldest ones
// while more than room are kept. Sessions are created in order, so each
// user's oldest session is the first of their list. b.mu must be held.
func (b *fakeBilling) prune(now time.Time, room int) {
	for len(b.created) > 0 && (len(b.created) > room || now.Sub(b.created[0].at) >= b.retention) {
		c := b.created[0]
		b.created[0] = billingCreated{}
		b.created = b.created[1:]
		if list := b.sessions[c.user]; len(list) <= 1 {
			delete(b.sessions, c.user)
		} else {
			b.sessions[c.user] = list[1:]
		}
		if c.key != "" && b.byKey[c.billingKey].ID == c.id {
			delete(b.byKey, c.billingKey)
		}
	}
}

// create returns a new open checkout session, or the one already created
// for the same user and idempotency key. Like Stripe, it refuses a key
// reused with other parameters (ok false): that is what the middleware
// answers with 422 while the store is up, and what this upstream check keeps
// true while the fail-open route runs without it.
func (b *fakeBilling) create(user int64, plan, idemKey string) (checkoutSession, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.prune(now, b.maxSessions)
	if idemKey != "" {
		if cs, found := b.byKey[billingKey{user, idemKey}]; found {
			return cs, cs.Plan == plan
		}
	}
	var id [12]byte
	_, _ = rand.Read(id[:])
	cs := checkoutSession{
		ID:        "cs_" + hex.EncodeToString(id[:]),
		Plan:      plan,
		Status:    "open",
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}
	cs.URL = "https://billing.example.invalid/checkout/" + cs.ID
	b.prune(now, b.maxSessions-1)
	b.sessions[user] = append(b.sessions[user], cs)
	if idemKey != "" {
		b.byKey[billingKey{user, idemKey}] = cs
	}
	b.created = append(b.created, billingCreated{billingKey{user, idemKey}, cs.ID, now})
	return cs, true
}

// list returns the user's checkout sessions still kept, oldest first.
func (b *fakeBilling) list(user int64) []checkoutSession {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(b.now(), b.maxSessions)
	return append([]checkoutSession{}, b.sessions[user]...)
}

// createCheckoutSession is POST /api/billing/checkout-sessions, behind the
// fail-open idempotency middleware.
func (s *server) createCheckoutSession(w http.ResponseWriter, r *http.Request) {
	uid, _ := userFromContext(r.Context())
	var in struct {
		Plan string `json:"plan"`
	}
	if !readJSON(w, r, &in, "invalid_checkout_session", false) {
		return
	}
	if !slices.Contains(plans, in.Plan) {
		writeJSON(w, http.StatusBadRequest, map[string]string{
			"error": "invalid_checkout_session", "message": "plan must be one of " + strings.Join(plans, ", "),
		})
		return
	}
	key, _ := idempotency.KeyFromContext(r.Context())
	cs, ok := s.billing.create(uid, in.Plan, key)
	if !ok {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": "idempotency_key_body_mismatch"})
		return
	}
	writeJSON(w, http.StatusCreated, cs)
}

// listCheckoutSessions is GET /api/billing/checkout-sessions.
func (s *server) listCheckoutSessions(w http.ResponseWriter, r *http.Request) {
	uid, _ := userFromContext(r.Context())
	writeJSON(w, http.StatusOK, map[string]any{"checkout_sessions": s.billing.list(uid)})
}
