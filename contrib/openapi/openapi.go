// Package idemopenapi declares an idempotency route's contract in an OpenAPI 3.0.3
// operation, built with kin-openapi (github.com/getkin/kin-openapi), so that
// generated clients send the Idempotency-Key and readers of the spec see the
// answers the middleware sends instead of the handler's.
//
// Operation adds, from the route's Config and RouteConfig:
//   - the Idempotency-Key header parameter, required iff RouteConfig.RequireKey,
//     with the syntax the route accepts (a UUID, or 1-255 visible ASCII
//     characters of at least RouteConfig.MinKeyLength);
//   - the error answers the route can send (400, 409, 413, 422, 503 with
//     Retry-After, 500 on a transactional route, and 422
//     idempotency_key_expired with RouteConfig.Expired ExpiredRefuse) in the route's real
//     format: application/json {"error": ...} by default,
//     application/problem+json (RFC 9457 plus "error") with ErrorProblem, or
//     the schema given with ErrorSchema for a Config.ErrorWriter;
//   - the Idempotent-Replayed header on every response the operation declares;
//   - the Idempotency-Expires header on every response but the middleware's
//     own 400, 413, 500 and 503, which read no row.
//
// Declare the handler's own responses first: Operation merges its answers into
// a status the handler also answers (anyOf the two bodies).
package idemopenapi

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/idemkit/idempotency"
)

// Header names the contract uses.
const (
	headerKey        = "Idempotency-Key"
	headerReplayed   = "Idempotent-Replayed"
	headerRetryAfter = "Retry-After"
	// headerExpires is item 21's Idempotency-Expires (idempotency.HeaderExpires).
	headerExpires = idempotency.HeaderExpires
)

// Option changes what Operation declares.
type Option func(*options)

type options struct {
	errorMedia  string
	errorSchema *openapi3.SchemaRef
}

// ErrorSchema declares the body a custom Config.ErrorWriter writes: its media
// type ("application/json") and its schema, used for every error answer of the
// route. Operation refuses a Config with an ErrorWriter without it, and this
// option without an ErrorWriter: the document must say what the route sends.
func ErrorSchema(mediaType string, schema *openapi3.SchemaRef) Option {
	return func(o *options) { o.errorMedia, o.errorSchema = mediaType, schema }
}

// Operation adds to op the Idempotency-Key parameter and the answers of the
// route that cfg and rc configure (idempotency.Middleware.Route(rc) of
// idempotency.New(store, cfg)), and declares Idempotent-Replayed on every
// response of op. An Idempotency-Key parameter op already has is replaced; a
// status op already declares keeps its description first and its body as one
// of anyOf; a response given by $ref is copied inline, so the shared
// component is not changed. It returns an error, leaving op unchanged, when
// the error format is not known (an ErrorWriter without ErrorSchema) or a
// response of op is an unresolved $ref.
func Operation(op *openapi3.Operation, cfg idempotency.Config, rc idempotency.RouteConfig, opts ...Option) error {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	media, schemaFor, err := errorFormat(cfg, o)
	if err != nil {
		return err
	}
	if op.Responses != nil {
		for code, ref := range op.Responses.Map() {
			if ref.Value == nil {
				return fmt.Errorf("openapi: response %s is an unresolved $ref %q: load the document before Operation", code, ref.Ref)
			}
		}
	}
	if op.Responses == nil {
		op.Responses = openapi3.NewResponses()
	}

	op.Parameters = slices.DeleteFunc(op.Parameters, func(p *openapi3.ParameterRef) bool {
		return p.Value != nil && p.Value.In == openapi3.ParameterInHeader && strings.EqualFold(p.Value.Name, headerKey)
	})
	op.Parameters = append(op.Parameters, &openapi3.ParameterRef{Value: keyParameter(cfg, rc)})

	ours := map[string]bool{} // codes only the middleware answers
	for _, g := range byStatus(routeAnswers(rc)) {
		ours[g.key()] = op.Responses.Value(g.key()) == nil
		resp := inline(op.Responses, g.key())
		mergeAnswer(resp, g, rc, media, schemaFor(g))
	}
	for code := range op.Responses.Map() {
		resp := inline(op.Responses, code)
		setHeader(resp, headerReplayed, replayedHeader(), false)
		if !ours[code] || !noExpires(code) {
			setHeader(resp, headerExpires, expiresHeader(), false)
		}
	}
	return nil
}

// errorFormat returns the media type of the route's error answers and the
// schema of a status group's body.
func errorFormat(cfg idempotency.Config, o options) (string, func(statusGroup) *openapi3.SchemaRef, error) {
	switch {
	case cfg.ErrorWriter != nil && o.errorSchema == nil:
		return "", nil, errors.New("openapi: Config.ErrorWriter is set: pass its body's schema with ErrorSchema")
	case cfg.ErrorWriter == nil && o.errorSchema != nil:
		return "", nil, errors.New("openapi: ErrorSchema is given but Config.ErrorWriter is not set: the route answers in Config.ErrorFormat")
	case cfg.ErrorWriter != nil:
		if o.errorMedia == "" {
			return "", nil, errors.New("openapi: ErrorSchema needs a media type")
		}
		return o.errorMedia, func(statusGroup) *openapi3.SchemaRef { return o.errorSchema }, nil
	case cfg.ErrorFormat == idempotency.ErrorProblem:
		return "application/problem+json", problemSchema, nil
	case cfg.ErrorFormat == idempotency.ErrorJSON:
		return "application/json", jsonErrorSchema, nil
	}
	return "", nil, fmt.Errorf("openapi: unknown Config.ErrorFormat %d", cfg.ErrorFormat)
}

// inline returns the response for code in rs, created when absent, copied
// out of its $ref when it has one.
func inline(rs *openapi3.Responses, code string) *openapi3.Response {
	ref := rs.Value(code)
	switch {
	case ref == nil:
		ref = &openapi3.ResponseRef{Value: openapi3.NewResponse()}
		rs.Set(code, ref)
	case ref.Ref != "":
		v := *ref.Value
		v.Headers = copyMap(v.Headers)
		v.Content = copyMap(v.Content)
		ref = &openapi3.ResponseRef{Value: &v}
		rs.Set(code, ref)
	}
	return ref.Value
}

func copyMap[M ~map[string]V, V any](m M) M {
	if m == nil {
		return nil
	}
	c := make(M, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// mergeAnswer declares group g in resp, beside whatever the handler answers
// with the same status.
func mergeAnswer(resp *openapi3.Response, g statusGroup, rc idempotency.RouteConfig, media string, schema *openapi3.SchemaRef) {
	handlers := resp.Content != nil || (resp.Description != nil && *resp.Description != "")
	desc := g.description(rc)
	if resp.Description != nil && *resp.Description != "" {
		desc = *resp.Description + " " + desc
	}
	resp.Description = &desc
	if resp.Content == nil {
		resp.Content = openapi3.Content{}
	}
	if mt := resp.Content[media]; mt != nil && mt.Schema != nil {
		merged := *mt
		merged.Schema = &openapi3.SchemaRef{Value: &openapi3.Schema{AnyOf: openapi3.SchemaRefs{mt.Schema, schema}}}
		resp.Content[media] = &merged
	} else {
		resp.Content[media] = &openapi3.MediaType{Schema: schema}
	}
	if g.has(func(a answer) bool { return a.retryAfter }) {
		// Required only when every answer of this status sends it.
		required := !handlers && g.every(func(a answer) bool { return a.retryAfter })
		setHeader(resp, headerRetryAfter, retryAfterHeader(), required)
	}
}

// setHeader declares header name on resp unless resp declares it already.
func setHeader(resp *openapi3.Response, name string, h *openapi3.Header, required bool) {
	for k := range resp.Headers {
		if strings.EqualFold(k, name) {
			return
		}
	}
	if resp.Headers == nil {
		resp.Headers = openapi3.Headers{}
	}
	h.Required = required
	resp.Headers[name] = &openapi3.HeaderRef{Value: h}
}

// noExpires reports whether the middleware's answers of code never carry
// Idempotency-Expires: item 21 sends it on every answer that read or wrote a
// committed row (the handler's own, a replay, 409 failed, not stored or
// outcome unknown, 422), never on 400, 413, 503 or a transactional route's
// 500 (its response over the buffer, rolled back). It is declared, not
// required, on every other response: a 409 in flight or by contention has
// no row to read it from.
func noExpires(code string) bool {
	return code == "400" || code == "413" || code == "500" || code == "503"
}
