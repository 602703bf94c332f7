package idempotencytest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
)

// newRequest returns a claim of a new random key in scope with a long TTL
// and lease.
func newRequest(scope string) idempotency.ClaimRequest {
	return Request(scope, longTTL, longLease)
}

// Request returns a claim of a new random key in scope, with ttl and
// lease, for the endpoint "POST /api/trading/orders".
func Request(scope string, ttl, lease time.Duration) idempotency.ClaimRequest {
	key := NewKey()
	return idempotency.ClaimRequest{
		Key:         key,
		Scope:       scope,
		Endpoint:    endpoint,
		RequestHash: HashOf(key, "body"),
		TTL:         ttl,
		Lease:       lease,
	}
}

// NewKey returns a random version 4 UUID in lower-case text.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// HashOf returns a request hash (64 lower-case hex characters) of parts.
func HashOf(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(sum[:])
}

// jsonResponse returns a JSON response with multi-valued headers.
func jsonResponse() idempotency.Response {
	return idempotency.Response{
		Status: 201,
		Header: http.Header{
			"Content-Type":     {"application/json"},
			"Location":         {"/api/trading/orders/42"},
			"Content-Language": {"en-GB", "de-DE", "fr"},
		},
		Body: []byte(`{"id": 42, "symbol": "AAPL", "side": "buy", "qty": 10, "status": "filled",
			"fill_price": 187.25, "tags": ["a", "b"], "note": "ünïcödé \u2028 \"quoted\"", "meta": {"none": null, "ok": true}}`),
		BodyKind: idempotency.BodyJSON,
	}
}

// rawResponse returns a raw response with body.
func rawResponse(body []byte) idempotency.Response {
	return idempotency.Response{
		Status:   200,
		Header:   http.Header{"Content-Type": {"application/octet-stream"}},
		Body:     body,
		BodyKind: idempotency.BodyRaw,
	}
}

// scribble modifies every byte and header of resp in place.
func scribble(resp idempotency.Response) {
	for i := range resp.Body {
		resp.Body[i] ^= 0xff
	}
	for _, vs := range resp.Header {
		for i := range vs {
			vs[i] = "scribbled"
		}
	}
	if resp.Header != nil {
		resp.Header.Set("X-Scribbled", "1")
	}
}

// MustClaim claims req, which must be a new key, and returns its record.
func MustClaim(t testing.TB, s idempotency.Store, req idempotency.ClaimRequest) idempotency.Record {
	t.Helper()
	res, err := s.Claim(t.Context(), req)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if !res.Won {
		t.Fatalf("Claim of a new key: Won = false; existing record %+v", res.Record)
	}
	return res.Record
}

// Read returns the row of req's key, which must exist, through Claim.
func Read(t testing.TB, s idempotency.Store, req idempotency.ClaimRequest) idempotency.Record {
	t.Helper()
	res, err := s.Claim(t.Context(), req)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if res.Won {
		t.Fatalf("Claim of an existing key won: the row was gone")
	}
	return res.Record
}

// WaitFor polls req's row until cond holds and returns it. The store's
// clock decides, so a row given a tiny TTL or lease is polled, never slept
// on: for Postgres it expires for the next statement only once that much
// time has passed on the database's clock.
func WaitFor(t testing.TB, s idempotency.Store, req idempotency.ClaimRequest, what string, cond func(idempotency.Record) bool) idempotency.Record {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		rec := Read(t, s, req)
		if cond(rec) {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("row not %s after %v: %+v", what, waitBound, rec)
		}
		time.Sleep(time.Millisecond)
	}
}

func isExpired(r idempotency.Record) bool   { return r.Expired }
func isLeaseOver(r idempotency.Record) bool { return r.LeaseOver }

// race runs f(0..n-1) in n goroutines released at once and waits for all.
func race(n int, f func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			f(i)
		})
	}
	close(start)
	wg.Wait()
}

// onlyWinner checks that exactly one of results won, and that the losers
// got the zero Record, and returns the winner's index.
func onlyWinner(t testing.TB, results []idempotency.ClaimResult) int {
	t.Helper()
	winner := -1
	for i, res := range results {
		switch {
		case res.Won && winner >= 0:
			t.Fatalf("racers %d and %d both won", winner, i)
		case res.Won:
			winner = i
		case !reflect.DeepEqual(res.Record, idempotency.Record{}):
			t.Errorf("loser %d got record %+v, want the zero Record", i, res.Record)
		}
	}
	if winner < 0 {
		t.Fatalf("none of %d racers won", len(results))
	}
	return winner
}

// wantNotOwner checks that err is ErrNotOwner and not a store failure.
func wantNotOwner(t testing.TB, what string, err error) {
	t.Helper()
	if !errors.Is(err, idempotency.ErrNotOwner) || errors.Is(err, idempotency.ErrStoreUnavailable) {
		t.Errorf("%s: error %v, want ErrNotOwner", what, err)
	}
}

// exportIDs returns the ids of the scope's rows.
func exportIDs(t testing.TB, s idempotency.Store, scope string) map[int64]bool {
	t.Helper()
	recs, err := s.ExportScope(t.Context(), scope)
	if err != nil {
		t.Fatalf("ExportScope: %v", err)
	}
	ids := make(map[int64]bool, len(recs))
	for _, r := range recs {
		ids[r.ID] = true
	}
	return ids
}

// checkFresh checks rec is a new in_flight claim of req at attempt.
func checkFresh(t testing.TB, rec idempotency.Record, req idempotency.ClaimRequest, attempt int32) {
	t.Helper()
	if rec.ID <= 0 {
		t.Errorf("claimed record: ID = %d, want > 0", rec.ID)
	}
	if rec.Key != req.Key || rec.Scope != req.Scope || rec.Endpoint != req.Endpoint {
		t.Errorf("claimed record is (%q, %q, %q), want (%q, %q, %q)", rec.Key, rec.Scope, rec.Endpoint, req.Key, req.Scope, req.Endpoint)
	}
	if rec.RequestHash != req.RequestHash {
		t.Errorf("claimed record: RequestHash = %q, want %q", rec.RequestHash, req.RequestHash)
	}
	if rec.Status != idempotency.StatusInFlight {
		t.Errorf("claimed record: Status = %q, want %q", rec.Status, idempotency.StatusInFlight)
	}
	if rec.Attempt != attempt {
		t.Errorf("claimed record: Attempt = %d, want %d", rec.Attempt, attempt)
	}
	if d := diffResponse(rec.Response, idempotency.Response{}); d != "" {
		t.Errorf("claimed record has a response: %s", d)
	}
	if rec.CreatedAt.IsZero() || rec.LockedAt.IsZero() {
		t.Errorf("claimed record: CreatedAt %v, LockedAt %v, want both set", rec.CreatedAt, rec.LockedAt)
	}
	checkDuration(t, "LockedAt - CreatedAt", rec.LockedAt.Sub(rec.CreatedAt), 0)
	checkDuration(t, "ExpiresAt - CreatedAt", rec.ExpiresAt.Sub(rec.CreatedAt), req.TTL)
	checkDuration(t, "LockedUntil - LockedAt", rec.LockedUntil.Sub(rec.LockedAt), req.Lease)
	if rec.Expired || rec.LeaseOver {
		t.Errorf("claimed record with TTL %v and lease %v: Expired %v, LeaseOver %v, want both false", req.TTL, req.Lease, rec.Expired, rec.LeaseOver)
	}
}

// checkDuration checks got is want within tolerance.
func checkDuration(t testing.TB, what string, got, want time.Duration) {
	t.Helper()
	if d := got - want; d < -tolerance || d > tolerance {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// sameRecord reports whether got and want describe the same row in the
// same state, and reports each difference. The flags Expired and LeaseOver
// are left out: they depend on when the row was read.
func sameRecord(t testing.TB, what string, got, want idempotency.Record) bool {
	t.Helper()
	var diffs []string
	add := func(field string, g, w any) { diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", field, g, w)) }
	if got.ID != want.ID {
		add("ID", got.ID, want.ID)
	}
	if got.Key != want.Key {
		add("Key", got.Key, want.Key)
	}
	if got.Scope != want.Scope {
		add("Scope", got.Scope, want.Scope)
	}
	if got.Endpoint != want.Endpoint {
		add("Endpoint", got.Endpoint, want.Endpoint)
	}
	if got.RequestHash != want.RequestHash {
		add("RequestHash", got.RequestHash, want.RequestHash)
	}
	if got.Status != want.Status {
		add("Status", got.Status, want.Status)
	}
	if got.Attempt != want.Attempt {
		add("Attempt", got.Attempt, want.Attempt)
	}
	if got.DeriveKeyID != want.DeriveKeyID {
		add("DeriveKeyID", got.DeriveKeyID, want.DeriveKeyID)
	}
	for _, tm := range []struct {
		field     string
		got, want time.Time
	}{
		{"CreatedAt", got.CreatedAt, want.CreatedAt},
		{"LockedAt", got.LockedAt, want.LockedAt},
		{"LockedUntil", got.LockedUntil, want.LockedUntil},
		{"ExpiresAt", got.ExpiresAt, want.ExpiresAt},
	} {
		if !tm.got.Equal(tm.want) {
			add(tm.field, tm.got, tm.want)
		}
	}
	if d := diffResponse(got.Response, want.Response); d != "" {
		diffs = append(diffs, "Response: "+d)
	}
	if len(diffs) > 0 {
		t.Errorf("%s differs:\n\t%s", what, strings.Join(diffs, "\n\t"))
		return false
	}
	return true
}

// diffResponse describes how got differs from want, or returns "". A JSON
// body is compared as a JSON value (a database may normalise its text),
// any other body byte for byte; an empty header equals a nil one.
func diffResponse(got, want idempotency.Response) string {
	var diffs []string
	if got.Status != want.Status {
		diffs = append(diffs, fmt.Sprintf("Status = %d, want %d", got.Status, want.Status))
	}
	if got.BodyKind != want.BodyKind {
		diffs = append(diffs, fmt.Sprintf("BodyKind = %d, want %d", got.BodyKind, want.BodyKind))
	}
	if got.SealKeyID != want.SealKeyID {
		diffs = append(diffs, fmt.Sprintf("SealKeyID = %q, want %q", got.SealKeyID, want.SealKeyID))
	}
	if want.BodyKind == idempotency.BodyJSON {
		if !jsonEqual(got.Body, want.Body) {
			diffs = append(diffs, fmt.Sprintf("JSON body = %s, want %s", got.Body, want.Body))
		}
	} else if !bytes.Equal(got.Body, want.Body) {
		diffs = append(diffs, fmt.Sprintf("body = %q, want %q", got.Body, want.Body))
	}
	if (len(got.Header) != 0 || len(want.Header) != 0) && !reflect.DeepEqual(got.Header, want.Header) {
		diffs = append(diffs, fmt.Sprintf("Header = %v, want %v", got.Header, want.Header))
	}
	return strings.Join(diffs, "; ")
}

// jsonEqual reports whether a and b are valid JSON encoding the same value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// StoreReason returns the Reason of err, which must be a *StoreError that
// matches ErrStoreUnavailable and carries its cause.
func StoreReason(t testing.TB, what string, err error) string {
	t.Helper()
	var se *idempotency.StoreError
	if !errors.As(err, &se) {
		t.Fatalf("%s: %T %v, want a *StoreError", what, err, err)
	}
	if !errors.Is(err, idempotency.ErrStoreUnavailable) {
		t.Errorf("%s: %v does not match ErrStoreUnavailable", what, err)
	}
	if se.Err == nil {
		t.Errorf("%s: StoreError without its cause", what)
	}
	return se.Reason
}

// ownedRequest returns a claim of a new random key with a fresh owner token.
func ownedRequest(scope string, ttl, lease time.Duration) idempotency.ClaimRequest {
	req := Request(scope, ttl, lease)
	req.Owner = uuid.New()
	return req
}

// unowned returns req without its owner token, to read its row as anyone
// else would.
func unowned(req idempotency.ClaimRequest) idempotency.ClaimRequest {
	req.Owner = uuid.Nil
	return req
}
