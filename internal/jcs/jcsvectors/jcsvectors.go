// Package jcsvectors reads and writes the golden request vectors of
// testdata/hash_vectors.json, at the top level as the design card names it:
// each a request, its canonical body (none when the body is hashed raw) and
// its request hash. The jcs tests check the canonical forms, the root
// package's tests the hashes.
package jcsvectors

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Vector is one golden request: its canonical body (nil when the body is
// hashed raw) and its request hash.
type Vector struct {
	Name       string  `json:"name"`
	Note       string  `json:"note,omitempty"`
	Method     string  `json:"method"`
	Path       string  `json:"path"`
	Query      string  `json:"query"`
	Body       *string `json:"body,omitempty"`        // the body as text
	BodyBase64 string  `json:"body_base64,omitempty"` // or, for bodies that are not UTF-8, as base64
	Canonical  *string `json:"canonical"`
	SameAs     string  `json:"same_as,omitempty"` // the vector whose hash this one must equal
	Hash       string  `json:"hash"`
}

// Bytes returns the vector's body bytes.
func (v Vector) Bytes(t testing.TB) []byte {
	t.Helper()
	if v.BodyBase64 != "" {
		b, err := base64.StdEncoding.DecodeString(v.BodyBase64)
		if err != nil {
			t.Fatalf("%s: body_base64: %v", v.Name, err)
		}
		return b
	}
	if v.Body == nil {
		t.Fatalf("%s: neither body nor body_base64", v.Name)
	}
	return []byte(*v.Body)
}

// Load reads the golden vectors from file, so every test checks the same
// requests.
func Load(t testing.TB, file string) []Vector {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var vs []Vector
	if err := json.Unmarshal(data, &vs); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(vs) < 24 {
		t.Fatalf("%s: %d vectors, want at least 24", file, len(vs))
	}
	return vs
}

// Write writes vs to file one per line, so a change to one vector is a
// one-line diff.
func Write(t *testing.T, file string, vs []Vector) {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString("[\n")
	for k, v := range vs {
		var line bytes.Buffer
		enc := json.NewEncoder(&line)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		writeVisible(&buf, bytes.TrimSuffix(line.Bytes(), []byte("\n")))
		if k < len(vs)-1 {
			buf.WriteByte(',')
		}
		buf.WriteByte('\n')
	}
	buf.WriteString("]\n")
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeVisible copies encoded JSON to buf with invisible characters (DEL,
// C1 controls, a BOM) as \u escapes, so the file shows every byte that
// matters. They can only occur inside strings, where the escape means the same.
func writeVisible(buf *bytes.Buffer, encoded []byte) {
	for _, r := range string(encoded) {
		switch {
		case r < utf8.RuneSelf && r != 0x7f, unicode.IsPrint(r):
			buf.WriteRune(r)
		case r > 0xFFFF:
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(buf, `\u%04x\u%04x`, hi, lo)
		default:
			fmt.Fprintf(buf, `\u%04x`, r)
		}
	}
}
