package idempotency

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
)

// TestDecodeHeadersAsJSON: decodeHeaders decodes every column as
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
		got, err := decodeHeaders([]byte(in))
		if (err != nil) != (wantErr != nil) || err != nil && err.Error() != wantErr.Error() {
			t.Errorf("decodeHeaders(%q) error %v; json.Unmarshal's %v", in, err, wantErr)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("decodeHeaders(%q) = %#v; json.Unmarshal's %#v", in, got, want)
		}
	}
}

// TestEncodeHeadersAsJSON: encodeHeaders writes the bytes json.Marshal
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
		got, err := encodeHeaders(h)
		if err != nil || wantErr != nil || string(got) != string(want) {
			t.Errorf("encodeHeaders(%#v) = %s, %v; json.Marshal's %s, %v", h, got, err, want, wantErr)
		}
	}
	if got, err := encodeHeaders(nil); got != nil || err != nil {
		t.Errorf("encodeHeaders(nil) = %q, %v; want nil (NULL)", got, err)
	}
}
