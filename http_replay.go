package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Replayable headers: these always, plus each route's allow-list.
// Content-Encoding describes the stored bytes, so it travels with them.
var defaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Location", "Content-Language"}

// neverReplayed are headers that must never be stored: credentials,
// cookies, per-connection and per-message headers.
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Authorization": true, "Www-Authenticate": true, "Date": true,
	"Connection": true, "Keep-Alive": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Upgrade": true, "Content-Length": true, HeaderReplayed: true,
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

var replayedField = []byte(`"idempotency_replayed"`)

// writeReplay sends a stored response: its status, its stored headers,
// Idempotent-Replayed: true, and its body, with "idempotency_replayed": true
// added when the body is a JSON object and mark is set.
func writeReplay(w http.ResponseWriter, resp Response, mark bool) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
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

// markReplayed adds "idempotency_replayed": true to a JSON object and
// returns any other JSON value unchanged.
func markReplayed(body []byte) []byte {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) < 2 || trimmed[0] != '{' {
		return body
	}
	if bytes.Contains(trimmed, replayedField) {
		// The field may already exist: set it through a full decode.
		var obj map[string]json.RawMessage
		if json.Unmarshal(trimmed, &obj) != nil {
			return body
		}
		obj["idempotency_replayed"] = json.RawMessage("true")
		out, err := json.Marshal(obj)
		if err != nil {
			return body
		}
		return out
	}
	inner := bytes.TrimSpace(trimmed[1 : len(trimmed)-1])
	out := make([]byte, 0, len(trimmed)+len(replayedField)+7)
	out = append(out, trimmed[:len(trimmed)-1]...)
	out = bytes.TrimRight(out, " \t\r\n")
	if len(inner) > 0 {
		out = append(out, ',')
	}
	out = append(out, replayedField...)
	out = append(out, ":true}"...)
	return out
}
