package idemclient

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// HeaderExpires is the answer header that says until when the server keeps
// the key (an HTTP date, to the second): a request sent after it runs as a
// new one.
const HeaderExpires = "Idempotency-Expires"

// ExpirySkew is how long before a key's advertised expiry (HeaderExpires)
// Transport and CheckRetry stop retrying it: the server's clock and this
// one may differ, and a retry that arrives after the expiry runs again.
const ExpirySkew = 60 * time.Second

// ErrKeyExpiring is the error of a retry that would be sent less than
// ExpirySkew before its key's advertised expiry, and so is not sent. The
// operation may have run: check its outcome before sending it again with a
// new key.
var ErrKeyExpiring = errors.New("idemclient: the key expires before the retry could be sent safely; check the operation's outcome before sending it again with a new key")

// advertisedExpiry returns resp's Idempotency-Expires, if it has a valid one.
func advertisedExpiry(resp *http.Response) (time.Time, bool) {
	if resp == nil {
		return time.Time{}, false
	}
	v := resp.Header.Get(HeaderExpires)
	if v == "" {
		return time.Time{}, false
	}
	t, err := http.ParseTime(v)
	return t, err == nil
}

// expiring reports whether a retry sent after wait would come within
// ExpirySkew of the advertised expiry expires (zero: none known).
func expiring(expires time.Time, wait time.Duration) bool {
	return !expires.IsZero() && !time.Now().Add(wait).Before(expires.Add(-ExpirySkew))
}

// keyExpiring is ErrKeyExpiring for attempt n, which got status (0: a
// transport error).
func keyExpiring(expires time.Time, n, status int) error {
	return fmt.Errorf("%w (attempt %d answered %d; the key expires at %s)", ErrKeyExpiring, n, status, expires.UTC().Format(http.TimeFormat))
}
