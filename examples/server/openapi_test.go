package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
)

// TestOpenAPIDocumentServed: GET /openapi.json answers the embedded
// document without a session, and the document declares the two wrapped
// routes with their Idempotency-Key. contrib/openapi validates the document
// itself and the server's real answers against it.
func TestOpenAPIDocumentServed(t *testing.T) {
	e := memoryBackend(t, envOptions{})
	r := e.do(t, req{method: "GET", path: "/openapi.json"})
	expect(t, r, http.StatusOK, "")
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	if !bytes.Equal(r.Raw, openapiJSON) {
		t.Fatalf("served %d bytes, not the embedded document (%d bytes)", len(r.Raw), len(openapiJSON))
	}
	var doc struct {
		OpenAPI string `json:"openapi"`
		Paths   map[string]map[string]struct {
			Parameters []struct{ Name, In string } `json:"parameters"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(r.Raw, &doc); err != nil {
		t.Fatalf("the document is not JSON: %v", err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Fatalf("openapi %q, want 3.0.3", doc.OpenAPI)
	}
	for _, p := range []string{"/api/trading/orders", "/api/billing/checkout-sessions"} {
		post, ok := doc.Paths[p]["post"]
		if !ok {
			t.Fatalf("POST %s is not declared", p)
		}
		found := false
		for _, prm := range post.Parameters {
			found = found || (prm.In == "header" && prm.Name == "Idempotency-Key")
		}
		if !found {
			t.Errorf("POST %s declares no Idempotency-Key header", p)
		}
	}
}
