package idemopenapi

import (
	"fmt"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/idemkit/idempotency"
)

// uuidPattern is the key a client should send on a UUID route: the
// 36-character 8-4-4-4-12 hex form, any version. The middleware also takes
// it as a structured-field string ("...") and with surrounding white space;
// the document declares the form clients generate.
const uuidPattern = `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`

// opaquePattern is an opaque key: visible ASCII characters or spaces.
const opaquePattern = `^[\x20-\x7E]+$`

// keyParameter is the Idempotency-Key header parameter of route rc.
func keyParameter(cfg idempotency.Config, rc idempotency.RouteConfig) *openapi3.Parameter {
	s := openapi3.NewStringSchema()
	var form string
	switch {
	case rc.ParseKey != nil:
		s.WithMinLength(int64(max(1, rc.MinKeyLength))).WithMaxLength(idempotency.MaxKeyLength)
		form = fmt.Sprintf("a key of %d to %d bytes, in the form this API defines", max(1, rc.MinKeyLength), idempotency.MaxKeyLength)
	case rc.KeyFormat == idempotency.KeyOpaque:
		s.WithMinLength(int64(max(1, rc.MinKeyLength))).WithMaxLength(idempotency.MaxKeyLength).WithPattern(opaquePattern)
		form = fmt.Sprintf("%d to %d visible ASCII characters or spaces, compared exactly", max(1, rc.MinKeyLength), idempotency.MaxKeyLength)
	default:
		s.WithFormat("uuid").WithPattern(uuidPattern)
		form = "a UUID (8-4-4-4-12 hex, any version), compared case-insensitively"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Makes this request safe to retry: send a new key, %s, for each operation, and the same key with the same request on every retry of it.", form)
	if rc.RequireKey {
		b.WriteString(" Required: a request without it is refused (400).")
	} else {
		b.WriteString(" Optional: a request without it runs without deduplication.")
	}
	b.WriteString(" A retry gets the first request's recorded response (Idempotent-Replayed: true) and the operation runs at most once")
	if cfg.Scope != nil {
		b.WriteString("; keys are scoped by user and endpoint")
	} else {
		b.WriteString("; keys are scoped by endpoint")
	}
	fmt.Fprintf(&b, " and remembered for %s.", ttlText(rc))
	if rc.FailOpen {
		b.WriteString(" While the idempotency store is down, this route runs the request without deduplication (fail-open).")
	} else {
		b.WriteString(" While the idempotency store is down, this route answers 503 and does not run the request (fail-closed).")
	}
	return openapi3.NewHeaderParameter(headerKey).WithRequired(rc.RequireKey).WithSchema(s).WithDescription(b.String())
}

// ttlText writes the route's TTL for people.
func ttlText(rc idempotency.RouteConfig) string {
	d := rc.TTL
	if d == 0 {
		d = idempotency.DefaultTTL
	}
	switch {
	case d > 24*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%d hours", d/time.Hour)
	}
	return d.String()
}

// errorMembers are the members both error formats share: the code and the
// extra members of the group's answers.
func errorMembers(g statusGroup) openapi3.Schemas {
	ps := openapi3.Schemas{
		"error": described(openapi3.NewStringSchema().WithEnum(g.codes()...), "The answer's code: an idempotency_... code, or for a missing or malformed key the contract's sentence."),
	}
	if g.has(func(a answer) bool { return a.retryMS }) {
		ps["retry_after_ms"] = described(openapi3.NewIntegerSchema().WithMin(0), "On idempotency_in_flight: milliseconds to wait before retrying the same key.")
	}
	if g.has(func(a answer) bool { return a.original }) {
		ps["original_status"] = described(openapi3.NewIntegerSchema().WithMin(100).WithMax(599), "On idempotency_response_not_stored: the status the first request completed with.")
	}
	return ps
}

// described returns s with description d.
func described(s *openapi3.Schema, d string) *openapi3.SchemaRef {
	s.Description = d
	return s.NewRef()
}

// jsonErrorSchema is the default format's body (Config.ErrorJSON):
// {"error": code} and the extra members.
func jsonErrorSchema(g statusGroup) *openapi3.SchemaRef {
	s := openapi3.NewObjectSchema().WithProperties(nil)
	s.Properties = errorMembers(g)
	s.Required = []string{"error"}
	return s.NewRef()
}

// problemSchema is the ErrorProblem format's body: RFC 9457's members plus
// the same "error" and extra members.
func problemSchema(g statusGroup) *openapi3.SchemaRef {
	s := openapi3.NewObjectSchema().WithProperties(nil)
	s.Description = "RFC 9457 problem details; the type URI ends with the answer's idempotency_... code."
	s.Properties = errorMembers(g)
	s.Properties["type"] = described(openapi3.NewStringSchema().WithFormat("uri"), "Config.ProblemTypeBase followed by the idempotency_... code.")
	s.Properties["title"] = openapi3.NewStringSchema().NewRef()
	s.Properties["status"] = openapi3.NewIntegerSchema().WithEnum(g.status).NewRef()
	s.Properties["detail"] = openapi3.NewStringSchema().NewRef()
	s.Properties["instance"] = openapi3.NewStringSchema().WithFormat("uri-reference").NewRef()
	s.Required = []string{"type", "title", "status", "error"}
	return s.NewRef()
}

// replayedHeader is Idempotent-Replayed.
func replayedHeader() *openapi3.Header {
	return &openapi3.Header{Parameter: openapi3.Parameter{
		Description: "\"true\" when this response replays the recorded response of the first request with this Idempotency-Key; absent otherwise. A replayed JSON object also carries \"idempotency_replayed\": true unless the route turns that off.",
		Schema:      openapi3.NewStringSchema().WithEnum("true").NewRef(),
	}}
}

// retryAfterHeader is Retry-After, in seconds.
func retryAfterHeader() *openapi3.Header {
	return &openapi3.Header{Parameter: openapi3.Parameter{
		Description: "Seconds to wait before retrying with the same Idempotency-Key.",
		Schema:      openapi3.NewIntegerSchema().WithMin(0).NewRef(),
	}}
}

// expiresHeader is item 21's Idempotency-Expires (see noExpires).
func expiresHeader() *openapi3.Header {
	return &openapi3.Header{Parameter: openapi3.Parameter{
		Description: "When the key is forgotten: its expires_at rounded down to the second, as an IMF-fixdate.",
		Schema:      openapi3.NewStringSchema().NewRef(),
	}}
}
