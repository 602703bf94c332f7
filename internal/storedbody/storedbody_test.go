package storedbody

import "testing"

func TestDecode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name         string
		jsonCol, raw []byte
		want         string
		wantNil      bool
		wantKind     Kind
	}{
		{"json", []byte(`{"a": 1,  "b":"\u0000"}`), nil, `{"a": 1,  "b":"\u0000"}`, false, JSON},
		{"raw", nil, []byte("hi"), "hi", false, Raw},
		{"empty raw", nil, []byte{}, "", false, Raw},
		{"none", nil, nil, "", true, None},
	} {
		body, kind := Decode(c.jsonCol, c.raw)
		if string(body) != c.want || (body == nil) != c.wantNil || kind != c.wantKind {
			t.Errorf("%s: Decode = %q (nil %v), %d; want %q (nil %v), %d", c.name, body, body == nil, kind, c.want, c.wantNil, c.wantKind)
		}
	}
}
