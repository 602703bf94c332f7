package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
)

// sessions issues and checks stateless bearer tokens: "<user id>.<MAC>",
// the MAC being HMAC-SHA256 of the user id under SESSION_SECRET. Any replica
// with the secret accepts them, with or without the database.
type sessions struct{ secret []byte }

// tokenContext separates these MACs from any other use of the secret.
const tokenContext = "idemkit-example-session-v1:"

func (s sessions) mac(id string) []byte {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(tokenContext + id))
	return m.Sum(nil)
}

// token returns the bearer token of user uid.
func (s sessions) token(uid int64) string {
	id := strconv.FormatInt(uid, 10)
	return id + "." + base64.RawURLEncoding.EncodeToString(s.mac(id))
}

// verify returns the user of a token, or false when it is not one of ours.
func (s sessions) verify(token string) (int64, bool) {
	id, sig, ok := strings.Cut(token, ".")
	if !ok {
		return 0, false
	}
	uid, err := strconv.ParseInt(id, 10, 64)
	if err != nil || uid <= 0 || strconv.FormatInt(uid, 10) != id {
		return 0, false
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(id)) {
		return 0, false
	}
	return uid, true
}

type userCtxKey struct{}

// userFromContext returns the session's user id.
func userFromContext(ctx context.Context) (int64, bool) {
	uid, ok := ctx.Value(userCtxKey{}).(int64)
	return uid, ok
}

// requireSession answers 401 unless the request carries "Authorization:
// Bearer <token>" with a valid token, and puts the user id in the context.
// It runs before the idempotency middleware, which scopes keys by user.
func (s *server) requireSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		uid, ok := int64(0), false
		if strings.EqualFold(scheme, "Bearer") {
			uid, ok = s.sessions.verify(strings.TrimSpace(token))
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idemkit-example"`)
			writeError(w, http.StatusUnauthorized, "unauthorized")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userCtxKey{}, uid)))
	})
}
