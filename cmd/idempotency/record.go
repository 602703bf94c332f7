package main

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"time"

	"github.com/idemkit/idempotency"
)

// recordJSON is one stored key as export writes it (one per line), and as
// inspect --json shows it. Times are RFC 3339 in UTC.
type recordJSON struct {
	Key         string `json:"key"`      // the Idempotency-Key as stored: a UUID in lower case, an opaque key exactly
	User        string `json:"user"`     // scope_user_id; "" is the unscoped scope
	Endpoint    string `json:"endpoint"` // scope_endpoint
	RequestHash string `json:"request_hash"`
	Status      string `json:"status"` // in_flight, completed or failed
	Attempt     int32  `json:"attempt"`
	// ResponseCode is the recorded HTTP status, null while none is recorded.
	ResponseCode *int `json:"response_code"`
	// ResponseBodyKind is json (ResponseBody), raw (ResponseBodyBase64) or
	// none (no body recorded: in flight, failed, or too large to store).
	ResponseBodyKind string      `json:"response_body_kind"`
	ResponseHeaders  http.Header `json:"response_headers,omitempty"`
	// ResponseBody is a JSON body as the JSON value itself.
	ResponseBody json.RawMessage `json:"response_body,omitempty"`
	// ResponseBodyBase64 is any other body, byte for byte, in standard
	// base64; "" for an empty body.
	ResponseBodyBase64 *string   `json:"response_body_base64,omitempty"`
	CreatedAt          time.Time `json:"created_at"`
	LockedAt           time.Time `json:"locked_at"`
	LockedUntil        time.Time `json:"locked_until"` // the lease's end
	ExpiresAt          time.Time `json:"expires_at"`
}

// newRecordJSON converts a stored record, with its response.
func newRecordJSON(r idempotency.Record) recordJSON {
	out := recordJSON{
		Key: r.Key, User: r.Scope, Endpoint: r.Endpoint, RequestHash: r.RequestHash,
		Status: string(r.Status), Attempt: r.Attempt,
		ResponseBodyKind: "none",
		ResponseHeaders:  r.Response.Header,
		CreatedAt:        r.CreatedAt.UTC(), LockedAt: r.LockedAt.UTC(),
		LockedUntil: r.LockedUntil.UTC(), ExpiresAt: r.ExpiresAt.UTC(),
	}
	if r.Response.Status != 0 {
		code := r.Response.Status
		out.ResponseCode = &code
	}
	out.setBody(r.Response.BodyKind, r.Response.Body)
	return out
}

// setBody fills the body fields.
func (o *recordJSON) setBody(kind idempotency.BodyKind, body []byte) {
	switch kind {
	case idempotency.BodyJSON:
		if json.Valid(body) {
			o.ResponseBodyKind = "json"
			o.ResponseBody = json.RawMessage(body)
			return
		}
		fallthrough // not JSON after all: keep the bytes
	case idempotency.BodyRaw:
		b64 := base64.StdEncoding.EncodeToString(body)
		o.ResponseBodyKind = "raw"
		o.ResponseBodyBase64 = &b64
	}
}

// skippedJSON is a live in_flight row erase left in place.
type skippedJSON struct {
	Key         string    `json:"key"`
	Endpoint    string    `json:"endpoint"`
	LockedUntil time.Time `json:"locked_until"`
}
