package idemclient

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
)

// Error codes of the middleware's HTTP contract: the "error" member of its
// JSON answers (also an extension member of its problem+json answers).
const (
	// CodeInFlight (409): another request with the key is running. Retry
	// the same key after Retry-After.
	CodeInFlight = "idempotency_in_flight"
	// CodePreviousFailed (409): the key's first request failed (5xx or a
	// panic). Never retried: the operation needs a new decision.
	CodePreviousFailed = "idempotency_previous_failed"
	// CodeOutcomeUnknown (409): the key's first request may or may not
	// have run. Never retried, and never retry it with a new key:
	// reconcile (look the operation up) instead.
	CodeOutcomeUnknown = "idempotency_outcome_unknown"
	// CodeResponseNotStored (409): the key's first request completed but
	// its response was too large to record. Never retried.
	CodeResponseNotStored = "idempotency_response_not_stored"
	// CodeKeyBodyMismatch (422): the key was used for another request.
	CodeKeyBodyMismatch = "idempotency_key_body_mismatch"
	// CodeKeyExpired (422): the key is past its lifetime (the server keeps
	// it as a tombstone). Never retried, and never retried with a new key
	// before the original's outcome is checked.
	CodeKeyExpired = "idempotency_key_expired"
	// CodeStoreUnavailable (503): the server could not reach its key
	// store. Retried with the same key after Retry-After.
	CodeStoreUnavailable = "idempotency_store_unavailable"
	// CodeBodyTooLarge (413): the request body is over the route's limit.
	CodeBodyTooLarge = "idempotency_body_too_large"
	// CodeBodyUnreadable (400): the request body did not arrive whole;
	// nothing ran. Retried with the same key.
	CodeBodyUnreadable = "idempotency_body_unreadable"
	// CodeScopeInvalid (400): the server cannot store the request's scope.
	CodeScopeInvalid = "idempotency_scope_invalid"
	// CodeResponseTooLarge (500): a transactional route's response was over
	// its buffer; the key is failed.
	CodeResponseTooLarge = "idempotency_response_too_large"
)

// Error is an error answer (status 400 or more) as the client sees it.
type Error struct {
	// Status is the response's status code.
	Status int
	// Code is the answer's error code: the "error" member of a JSON or
	// problem+json body, else the code a problem+json "type" URI ends
	// with (idempotency_...), else "". It is one of the Code constants for
	// the middleware's own answers, and the handler's code for the
	// handler's answers (a replayed 400, say).
	Code string
}

// Error implements error.
func (e *Error) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("idemclient: status %d", e.Status)
	}
	return fmt.Sprintf("idemclient: status %d: %s", e.Status, e.Code)
}

// maxErrorBody bounds how much of a body ErrorFrom reads to find the code;
// the contract's bodies are a few dozen bytes.
const maxErrorBody = 64 << 10

// ErrorFrom returns the error that resp answers, or nil when resp is nil
// or its status is below 400. It reads at most 64 KiB of the body to find
// the code and puts what it read back in front of the rest, so resp.Body
// still reads whole afterwards (and must still be closed).
func ErrorFrom(resp *http.Response) *Error {
	if resp == nil || resp.StatusCode < 400 {
		return nil
	}
	return &Error{Status: resp.StatusCode, Code: peekCode(resp)}
}

// peekCode returns the error code of resp's body, restoring the body.
func peekCode(resp *http.Response) string {
	if resp.Body == nil || resp.Body == http.NoBody || !isJSON(resp.Header.Get("Content-Type")) {
		return ""
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	resp.Body = &readCloser{Reader: io.MultiReader(bytes.NewReader(head), errReader{err}, resp.Body), Closer: resp.Body}
	return codeOf(head)
}

// errReader returns err, once reading reaches it; nil reads as the end of
// its part, so the rest of the body follows.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	return 0, io.EOF
}

// isJSON reports whether the media type is JSON: application/json,
// application/problem+json or another +json type.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// codeOf returns the error code of a JSON body: the "error" member, or the
// code a problem+json "type" URI ends with.
func codeOf(body []byte) string {
	var b struct {
		Error any    `json:"error"`
		Type  string `json:"type"`
	}
	if json.Unmarshal(body, &b) != nil {
		return ""
	}
	if s, ok := b.Error.(string); ok && s != "" {
		return s
	}
	return codeOfType(b.Type)
}

// codeOfType returns the idempotency_... code that a problem type URI
// names in its last segment (after '/', '#' or ':'), with '-' read as '_';
// "" for any other URI (about:blank included).
func codeOfType(uri string) string {
	seg := uri[strings.LastIndexAny(uri, "/#:")+1:]
	seg = strings.ToLower(strings.ReplaceAll(seg, "-", "_"))
	if !strings.HasPrefix(seg, "idempotency_") {
		return ""
	}
	for _, c := range seg {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return ""
		}
	}
	return seg
}
