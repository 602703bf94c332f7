package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Replayable headers: these always, plus each route's allow-list.
// Content-Encoding describes the stored bytes, so it travels with them.
var defaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Location", "Content-Language"}

// neverReplayed are headers that must never be stored: credentials,
// cookies, per-connection and per-message headers.
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Authorization": true, "Www-Authenticate": true, "Date": true,
	"Connection": true, "Keep-Alive": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Upgrade": true, "Content-Length": true, HeaderReplayed: true, HeaderExpires: true,
}

// replayAllowList validates a route's extra replay headers and returns the
// full allow-list in canonical form.
func replayAllowList(extra []string) ([]string, error) {
	list := append([]string(nil), defaultReplayHeaders...)
	for _, h := range extra {
		c := http.CanonicalHeaderKey(strings.TrimSpace(h))
		if c == "" || neverReplayed[c] || strings.HasPrefix(c, "Proxy-") {
			return nil, errors.New("idempotency: RouteConfig.ReplayHeaders: header " + strconv.Quote(h) + " may not be replayed")
		}
		if !slices.Contains(list, c) {
			list = append(list, c)
		}
	}
	return list, nil
}

// replayedName is the member a replayed JSON object is marked with.
const replayedName = "idempotency_replayed"

// replayedMember is what a replayed JSON object gets right after its
// opening brace.
var replayedMember = []byte(`"` + replayedName + `":true`)

// writeReplay sends a stored response: its status, its stored headers,
// Idempotent-Replayed: true, Idempotency-Expires (unless expires is zero),
// and its body as recorded, with "idempotency_replayed":true inserted when
// the body is a JSON object and mark is set.
func writeReplay(w http.ResponseWriter, resp Response, mark bool, expires time.Time) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	expiresHeader(h, expires) // over any stored one: the row's own
	body := resp.Body
	if mark && resp.BodyKind == BodyJSON {
		body = markReplayed(body)
	}
	// Canonical names, so Header.Set's canonicalisation is skipped.
	h[HeaderReplayed] = []string{"true"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(body)
}

// markReplayed returns the recorded bytes of a JSON object with
// "idempotency_replayed":true inserted right after its opening brace (and
// a comma when the object has members): white space, member order and
// escapes stay as recorded. Any other value, and an object that already
// has a member of that name, is returned as it is.
func markReplayed(body []byte) []byte {
	open := skipSpace(body, 0)
	if open == len(body) || body[open] != '{' || hasReplayedMember(body[open:]) {
		return body
	}
	rest := body[open+1:]
	out := make([]byte, 0, len(body)+len(replayedMember)+1)
	out = append(out, body[:open+1]...)
	out = append(out, replayedMember...)
	if i := skipSpace(rest, 0); i < len(rest) && rest[i] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...)
}

// hasReplayedMember reports whether the JSON object obj (from its '{')
// has a member named idempotency_replayed at its top level, its name
// written with escapes or without. Only a body that holds the name or an
// escape is scanned.
func hasReplayedMember(obj []byte) bool {
	if !bytes.Contains(obj, []byte(replayedName)) && !bytes.Contains(obj, []byte(`\u`)) {
		return false
	}
	for i := 1; ; i++ { // i: after '{' or a ','
		i = skipSpace(obj, i)
		end := stringEnd(obj, i)
		if end < 0 {
			return false // '}' of an empty object, or not JSON
		}
		if isReplayedName(obj[i:end]) {
			return true
		}
		i = skipSpace(obj, end)
		if i == len(obj) || obj[i] != ':' {
			return false
		}
		i = skipSpace(obj, valueEnd(obj, i+1))
		if i == len(obj) || obj[i] != ',' {
			return false
		}
	}
}

// isReplayedName reports whether the quoted JSON string q is the marker's
// name.
func isReplayedName(q []byte) bool {
	if string(q) == `"`+replayedName+`"` {
		return true
	}
	var name string
	return bytes.IndexByte(q, '\\') >= 0 && json.Unmarshal(q, &name) == nil && name == replayedName
}

// skipSpace returns the index of the first byte of b at or after i that is
// not JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string that starts at
// b[i], or -1 when none starts there or it does not end.
func stringEnd(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// valueEnd returns the index just past the JSON value that starts at or
// after b[i] (white space first): past a string, or past the bracket that
// closes an object or array; a number or literal ends at the ',' or '}'
// that follows it.
func valueEnd(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			end := stringEnd(b, i)
			if end < 0 {
				return len(b)
			}
			if depth == 0 {
				return end
			}
			i = end
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case ',':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	return i
}
