package storedbody

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
)

// TestDecodeHeadersAsJSON: DecodeHeaders decodes every column as
// json.Unmarshal does, the plain form it parses itself and all the rest
// (escapes, other bytes, null, syntax errors), value for value, nil for
// nil and error for error.
func TestDecodeHeadersAsJSON(t *testing.T) {
	for _, in := range []string{
		`{"Content-Type": ["application/json"], "Location": ["/api/trading/orders/42"]}`,
		`{"Content-Type":["application/json"]}`,
		` { "A" : [ "1" , "2" ] , "B":[] } `,
		"{\t\"A\":\n[\"1\"]\r}",
		`{}`, `{ }`, `null`, `[]`, `""`, ``, `{`, `{"A"}`, `{"A":}`, `{"A":[}`, `{"A":["1",]}`, `{"A":["1"],}`,
		`{"A":["1"]} x`, `{"A":["1"]}}`, `{"A":"1"}`, `{"A":[1]}`, `{"A":[null]}`, `{"A":null}`,
		`{"A":["1"],"A":["2"]}`, `{"A":["1"],"a":["2"]}`,
		`{"A":["a\"b"]}`, `{"A":["a\\b"]}`, `{"A":["\u00e9"]}`, `{"A":["é"]}`, "{\"A\":[\"\xff\"]}",
		"{\"A\":[\"a\x7fb\"]}", "{\"A\":[\"a\x01b\"]}", "{\"A\":[\"a\tb\"]}", `{"":[""]}`, `{"A":["<&>"]}`,
	} {
		var want http.Header
		wantErr := json.Unmarshal([]byte(in), &want)
		got, err := DecodeHeaders([]byte(in))
		if (err != nil) != (wantErr != nil) || err != nil && err.Error() != wantErr.Error() {
			t.Errorf("DecodeHeaders(%q) error %v; json.Unmarshal's %v", in, err, wantErr)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("DecodeHeaders(%q) = %#v; json.Unmarshal's %#v", in, got, want)
		}
	}
}

// TestEncodeHeadersAsJSON: EncodeHeaders writes the bytes json.Marshal
// writes (of the header without NUL values), for plain headers and all
// the others.
func TestEncodeHeadersAsJSON(t *testing.T) {
	many := http.Header{}
	for i := range 12 {
		many[string(rune('L'-i))+"-H"] = []string{"v", string(rune('a' + i))}
	}
	for _, h := range []http.Header{
		{}, {"Content-Type": {"application/json"}},
		{"Location": {"/api/trading/orders/42"}, "Content-Type": {"application/json"}, "Content-Language": {"en", "de"}},
		{"A": nil}, {"A": {}}, {"A": {""}}, {"": {"x"}}, many,
		{"A": {`a"b`}}, {"A": {`a\b`}}, {"A": {"<b>"}}, {"A": {"a&b"}}, {"A": {"é"}}, {"A": {"\xff"}},
		{"A": {"a\tb"}}, {"A": {"a\x7fb"}}, {"A": {"a\x00b", "ok"}}, {"A\"": {"x"}}, {"A": {"\u2028"}},
	} {
		want, wantErr := json.Marshal(withoutNUL(h))
		got, err := EncodeHeaders(h)
		if err != nil || wantErr != nil || string(got) != string(want) {
			t.Errorf("EncodeHeaders(%#v) = %s, %v; json.Marshal's %s, %v", h, got, err, want, wantErr)
		}
	}
	if got, err := EncodeHeaders(nil); got != nil || err != nil {
		t.Errorf("EncodeHeaders(nil) = %q, %v; want nil (NULL)", got, err)
	}
}

// FuzzDecodeHeaders holds DecodeHeaders equal to json.Unmarshal into an
// http.Header for any column: value for value, and error for error.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{`{"Content-Type":["application/json"]}`, ` { "A" : [ "1" , "2" ] , "B":[] } `,
		`{"A":["a\"b"]}`, `{"A":null}`, `null`, `{"A":["1"],"A":["2"]}`, "{\"A\":[\"\xff\"]}", `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var want http.Header
		wantErr := json.Unmarshal(in, &want)
		got, err := DecodeHeaders(in)
		if (err != nil) != (wantErr != nil) || err != nil && err.Error() != wantErr.Error() {
			t.Fatalf("DecodeHeaders(%q) error %v; json.Unmarshal's %v", in, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("DecodeHeaders(%q) = %#v; json.Unmarshal's %#v", in, got, want)
		}
	})
}

// FuzzEncodeHeaders holds EncodeHeaders equal to json.Marshal of the
// header without its NUL values, for headers of up to three names of up to
// two values each built from the fuzzer's strings.
func FuzzEncodeHeaders(f *testing.F) {
	f.Add("Content-Type", "application/json", "Location", "/a/b", "x")
	f.Add("A", "a\"b", "B", "<&>", "\x00")
	f.Add("\xff", "\u2028", "", "a\tb", "é")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, v3 string) {
		for _, h := range []http.Header{
			{k1: {v1}}, {k1: {v1, v2}, k2: {v3}}, {k1: nil, k2: {}}, {k1: {v1}, k2: {v2, v3}, v1: {k1}},
		} {
			want, wantErr := json.Marshal(withoutNUL(h))
			got, err := EncodeHeaders(h)
			if err != nil || wantErr != nil || string(got) != string(want) {
				t.Fatalf("EncodeHeaders(%#v) = %s, %v; json.Marshal's %s, %v", h, got, err, want, wantErr)
			}
		}
	})
}
