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

// fakeBilling stands in for a billing provider such as Stripe. It lives in
// the process's memory, so billing keeps working while the database is
// down, and like Stripe it deduplicates on the caller's idempotency key:
// that upstream protection is why the billing route may fail open.
type fakeBilling struct {
	mu       sync.Mutex
	sessions map[int64][]checkoutSession
	byKey    map[billingKey]checkoutSession
}

type billingKey struct {
	user int64
	key  string
}

func newFakeBilling() *fakeBilling {
	return &fakeBilling{sessions: map[int64][]checkoutSession{}, byKey: map[billingKey]checkoutSession{}}
}

// create returns a new open checkout session, or the one already created
// for the same user and idempotency key. Like Stripe, it refuses a key
// reused with other parameters (ok false): that is what the middleware
// answers with 422 while the store is up, and what this upstream check keeps
// true while the fail-open route runs without it.
func (b *fakeBilling) create(user int64, plan, idemKey string) (checkoutSession, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
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
	b.sessions[user] = append(b.sessions[user], cs)
	if idemKey != "" {
		b.byKey[billingKey{user, idemKey}] = cs
	}
	return cs, true
}

// list returns the user's checkout sessions, oldest first.
func (b *fakeBilling) list(user int64) []checkoutSession {
	b.mu.Lock()
	defer b.mu.Unlock()
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
