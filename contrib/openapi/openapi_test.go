package idemopenapi_test

import (
	"context"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/idemkit/idempotency"
	idemopenapi "github.com/idemkit/idempotency/contrib/openapi"
)

// declare returns a new operation with a 201 after Operation, in a document
// that validates.
func declare(t *testing.T, cfg idempotency.Config, rc idempotency.RouteConfig, opts ...idemopenapi.Option) *openapi3.Operation {
	t.Helper()
	op := &openapi3.Operation{OperationID: "create", Responses: openapi3.NewResponses()}
	op.Responses.Set("201", &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("Created.")})
	if err := idemopenapi.Operation(op, cfg, rc, opts...); err != nil {
		t.Fatalf("Operation: %v", err)
	}
	validate(t, op)
	return op
}

// validate checks a document holding op alone.
func validate(t *testing.T, op *openapi3.Operation) {
	t.Helper()
	doc := &openapi3.T{OpenAPI: "3.0.3", Info: &openapi3.Info{Title: "t", Version: "1"}, Paths: openapi3.NewPaths()}
	doc.Paths.Set("/x", &openapi3.PathItem{Post: op})
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the document is not valid: %v", err)
	}
}

// keyParam returns op's Idempotency-Key parameters.
func keyParams(op *openapi3.Operation) []*openapi3.Parameter {
	var ps []*openapi3.Parameter
	for _, p := range op.Parameters {
		if p.Value.In == "header" && http.CanonicalHeaderKey(p.Value.Name) == "Idempotency-Key" {
			ps = append(ps, p.Value)
		}
	}
	return ps
}

func TestOperationKeyParameter(t *testing.T) {
	t.Parallel()
	parse := func(v string) (string, error) { return v, nil }
	cases := []struct {
		name       string
		rc         idempotency.RouteConfig
		required   bool
		pattern    string
		format     string
		minLength  uint64
		maxLength  uint64
		noMaxLimit bool
	}{
		{name: "uuid, optional", rc: idempotency.RouteConfig{},
			pattern: `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`, format: "uuid", noMaxLimit: true},
		{name: "uuid, required", rc: idempotency.RouteConfig{RequireKey: true}, required: true,
			pattern: `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`, format: "uuid", noMaxLimit: true},
		{name: "opaque", rc: idempotency.RouteConfig{KeyFormat: idempotency.KeyOpaque, MinKeyLength: 20},
			pattern: `^[\x20-\x7E]+$`, minLength: 20, maxLength: 255},
		{name: "opaque, no minimum", rc: idempotency.RouteConfig{KeyFormat: idempotency.KeyOpaque},
			pattern: `^[\x20-\x7E]+$`, minLength: 1, maxLength: 255},
		{name: "ParseKey", rc: idempotency.RouteConfig{ParseKey: parse, MinKeyLength: 16, RequireKey: true}, required: true,
			minLength: 16, maxLength: 255},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			op := &openapi3.Operation{Responses: openapi3.NewResponses()}
			// An existing declaration, in another case, is replaced.
			op.Parameters = openapi3.Parameters{{Value: openapi3.NewHeaderParameter("idempotency-key")}}
			if err := idemopenapi.Operation(op, idempotency.Config{}, c.rc); err != nil {
				t.Fatal(err)
			}
			validate(t, op)
			ps := keyParams(op)
			if len(ps) != 1 {
				t.Fatalf("%d Idempotency-Key parameters, want 1", len(ps))
			}
			p, s := ps[0], ps[0].Schema.Value
			if p.Required != c.required {
				t.Errorf("required %v, want %v", p.Required, c.required)
			}
			if s.Pattern != c.pattern || s.Format != c.format || s.MinLength != c.minLength {
				t.Errorf("schema pattern %q format %q minLength %d, want %q %q %d", s.Pattern, s.Format, s.MinLength, c.pattern, c.format, c.minLength)
			}
			if c.noMaxLimit != (s.MaxLength == nil) || (s.MaxLength != nil && *s.MaxLength != c.maxLength) {
				t.Errorf("schema maxLength %v, want %d", s.MaxLength, c.maxLength)
			}
		})
	}
}

// TestOperationStatuses: the statuses follow the route's config, each in
// its format's media type, with Retry-After where the answers send it.
func TestOperationStatuses(t *testing.T) {
	t.Parallel()
	codes := func(op *openapi3.Operation) []string {
		ks := op.Responses.Keys()
		slices.Sort(ks)
		return ks
	}
	op := declare(t, idempotency.Config{}, idempotency.RouteConfig{})
	if got, want := codes(op), []string{"201", "400", "409", "413", "422", "503"}; !slices.Equal(got, want) {
		t.Errorf("default route declares %v, want %v", got, want)
	}
	for _, code := range []string{"400", "409", "413", "422", "503"} {
		if op.Responses.Value(code).Value.Content.Get("application/json") == nil {
			t.Errorf("%s is not application/json", code)
		}
	}
	if h := op.Responses.Value("503").Value.Headers["Retry-After"]; h == nil || !h.Value.Required {
		t.Errorf("503 does not require Retry-After: %v", h)
	}
	if h := op.Responses.Value("409").Value.Headers["Retry-After"]; h == nil || h.Value.Required {
		t.Errorf("409 must declare Retry-After, not required (only in flight sends it): %v", h)
	}

	op = declare(t, idempotency.Config{}, idempotency.RouteConfig{Transactional: true, MaxBodyBytes: math.MaxInt64})
	if got, want := codes(op), []string{"201", "400", "409", "422", "500", "503"}; !slices.Equal(got, want) {
		t.Errorf("transactional route without a body limit declares %v, want %v", got, want)
	}

	op = declare(t, idempotency.Config{ErrorFormat: idempotency.ErrorProblem}, idempotency.RouteConfig{})
	mt := op.Responses.Value("422").Value.Content.Get("application/problem+json")
	if mt == nil {
		t.Fatal("422 is not application/problem+json with ErrorProblem")
	}
	if got := mt.Schema.Value.Required; !slices.Equal(got, []string{"type", "title", "status", "error"}) {
		t.Errorf("problem+json requires %v", got)
	}

	// A status the handler answers too keeps its body as one of anyOf, and
	// its own Retry-After rule.
	op = &openapi3.Operation{Responses: openapi3.NewResponses()}
	own := openapi3.NewObjectSchema().WithProperty("error", openapi3.NewStringSchema())
	op.Responses.Set("503", &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("Gate closed.").WithJSONSchema(own)})
	if err := idemopenapi.Operation(op, idempotency.Config{}, idempotency.RouteConfig{}); err != nil {
		t.Fatal(err)
	}
	validate(t, op)
	r := op.Responses.Value("503").Value
	if s := r.Content.Get("application/json").Schema.Value; len(s.AnyOf) != 2 || s.AnyOf[0].Value != own {
		t.Errorf("the handler's 503 body is not kept as anyOf's first: %+v", s)
	}
	if h := r.Headers["Retry-After"]; h == nil || h.Value.Required {
		t.Errorf("a 503 the handler answers too must declare Retry-After, not required: %v", h)
	}
}

// TestOperationReplayedOnEveryResponse: Idempotent-Replayed is declared on
// every response, the handler's own included; a $ref response is copied,
// not changed.
func TestOperationReplayedOnEveryResponse(t *testing.T) {
	t.Parallel()
	shared := &openapi3.ResponseRef{Ref: "#/components/responses/NotFound", Value: openapi3.NewResponse().WithDescription("Not found.")}
	op := &openapi3.Operation{Responses: openapi3.NewResponses()}
	op.Responses.Set("201", &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("Created.")})
	op.Responses.Set("404", shared)
	op.Responses.Set("default", &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("Other.")})
	if err := idemopenapi.Operation(op, idempotency.Config{}, idempotency.RouteConfig{}); err != nil {
		t.Fatal(err)
	}
	for code, r := range op.Responses.Map() {
		h := r.Value.Headers["Idempotent-Replayed"]
		if h == nil || h.Value.Required || !slices.Equal(h.Value.Schema.Value.Enum, []any{"true"}) {
			t.Errorf("%s: Idempotent-Replayed %v", code, h)
		}
		h = r.Value.Headers["Idempotency-Expires"]
		switch code {
		case "400", "413", "503": // the middleware's own, which read no row (TestOperationDeclaresExpires)
		default:
			if h == nil || h.Value.Required || !h.Value.Schema.Value.Type.Is("string") {
				t.Errorf("%s: Idempotency-Expires %v, want it declared, a string, not required", code, h)
			}
		}
	}
	if shared.Value.Headers != nil {
		t.Errorf("the shared component response was changed: %v", shared.Value.Headers)
	}
}

// TestOperationDeclaresExpires: Idempotency-Expires is declared on every
// response but the middleware's own 400, 413, 500 and 503 (settled item
// 21: they read no row); on a status the handler answers too, it is.
func TestOperationDeclaresExpires(t *testing.T) {
	t.Parallel()
	op := &openapi3.Operation{Responses: openapi3.NewResponses()}
	op.Responses.Set("201", &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("Created.")})
	op.Responses.Set("400", &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("The handler's own 400.")})
	if err := idemopenapi.Operation(op, idempotency.Config{}, idempotency.RouteConfig{Transactional: true}); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"201": true, "400": true, "409": true, "413": false, "422": true, "500": false, "503": false}
	for code, declared := range want {
		r := op.Responses.Value(code)
		if r == nil {
			t.Fatalf("no %s response", code)
		}
		if got := r.Value.Headers["Idempotency-Expires"] != nil; got != declared {
			t.Errorf("%s: Idempotency-Expires declared %v, want %v", code, got, declared)
		}
	}
}

// TestOperationRefuses: an error format the document cannot know, and an
// unresolved $ref, are refused, and op is left as it was.
func TestOperationRefuses(t *testing.T) {
	t.Parallel()
	writer := func(http.ResponseWriter, *http.Request, idempotency.ErrorAnswer) {}
	schema := openapi3.NewStringSchema().NewRef()
	cases := []struct {
		name string
		cfg  idempotency.Config
		opts []idemopenapi.Option
		resp *openapi3.ResponseRef
	}{
		{name: "ErrorWriter without ErrorSchema", cfg: idempotency.Config{ErrorWriter: writer}},
		{name: "ErrorSchema without ErrorWriter", opts: []idemopenapi.Option{idemopenapi.ErrorSchema("text/plain", schema)}},
		{name: "ErrorSchema without a media type", cfg: idempotency.Config{ErrorWriter: writer}, opts: []idemopenapi.Option{idemopenapi.ErrorSchema("", schema)}},
		{name: "unresolved $ref", resp: &openapi3.ResponseRef{Ref: "#/components/responses/Gone"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			op := &openapi3.Operation{}
			if c.resp != nil {
				op.Responses = openapi3.NewResponses(openapi3.WithStatus(410, c.resp))
			}
			if err := idemopenapi.Operation(op, c.cfg, idempotency.RouteConfig{}, c.opts...); err == nil {
				t.Fatal("no error")
			}
			if op.Parameters != nil || (c.resp == nil && op.Responses != nil) || (c.resp != nil && op.Responses.Len() != 1) {
				t.Errorf("op was changed: %+v", op)
			}
		})
	}
}

// TestOperationKeyExpired: a route with RouteConfig.Expired ExpiredRefuse
// declares 422 idempotency_key_expired beside the body mismatch, in both
// formats, and a route that runs an expired key again does not.
func TestOperationKeyExpired(t *testing.T) {
	t.Parallel()
	enum := func(op *openapi3.Operation, media string) []any {
		t.Helper()
		mt := op.Responses.Value("422").Value.Content.Get(media)
		if mt == nil {
			t.Fatalf("422 has no %s body", media)
		}
		return mt.Schema.Value.Properties["error"].Value.Enum
	}
	refuse := idempotency.RouteConfig{Expired: idempotency.ExpiredRefuse}
	for _, c := range []struct {
		cfg   idempotency.Config
		rc    idempotency.RouteConfig
		media string
		want  []any
	}{
		{idempotency.Config{}, idempotency.RouteConfig{}, "application/json", []any{"idempotency_key_body_mismatch"}},
		{idempotency.Config{}, refuse, "application/json", []any{"idempotency_key_body_mismatch", "idempotency_key_expired"}},
		{idempotency.Config{ErrorFormat: idempotency.ErrorProblem}, refuse, "application/problem+json", []any{"idempotency_key_body_mismatch", "idempotency_key_expired"}},
	} {
		op := declare(t, c.cfg, c.rc)
		if got := enum(op, c.media); !slices.Equal(got, c.want) {
			t.Errorf("Expired %v, %s: 422 codes %v, want %v", c.rc.Expired, c.media, got, c.want)
		}
		if d := op.Responses.Value("422").Value.Description; c.rc.Expired == idempotency.ExpiredRefuse && !strings.Contains(*d, "idempotency_key_expired") {
			t.Errorf("the 422 description does not say what idempotency_key_expired means: %q", *d)
		}
	}
}
