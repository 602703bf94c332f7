package idempotency

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestMarkReplayedBytes: a replay is the bytes recorded; with the marker
// on, the only change to a JSON object is "idempotency_replayed":true right
// after its opening brace. The test compares bytes.
func TestMarkReplayedBytes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, in, want string }{
		{"json.Encoder's trailing newline", "{\"a\":1}\n", "{\"idempotency_replayed\":true,\"a\":1}\n"},
		{"white space kept", " \t{ \"b\" : 2 ,\n \"a\":1 }\r\n", " \t{\"idempotency_replayed\":true, \"b\" : 2 ,\n \"a\":1 }\r\n"},
		{"empty object", `{}`, `{"idempotency_replayed":true}`},
		{"empty object with space", "{ \n}\n", "{\"idempotency_replayed\":true \n}\n"},
		{"member order kept", `{"z":1,"a":2,"m":3}`, `{"idempotency_replayed":true,"z":1,"a":2,"m":3}`},
		{"< > & kept", `{"html":"<b>&</b>","esc":"\u003c"}`, `{"idempotency_replayed":true,"html":"<b>&</b>","esc":"\u003c"}`},
		{"the name nested", `{"order":{"idempotency_replayed":false},"n":[{"idempotency_replayed":1}]}`,
			`{"idempotency_replayed":true,"order":{"idempotency_replayed":false},"n":[{"idempotency_replayed":1}]}`},
		{"the name as a value", `{"note":"idempotency_replayed","q":"\"idempotency_replayed\":"}`,
			`{"idempotency_replayed":true,"note":"idempotency_replayed","q":"\"idempotency_replayed\":"}`},
		{"the name after a nested value", `{"a":{"b":[1,{"c":"}"}]},"s":"x\\"}`, `{"idempotency_replayed":true,"a":{"b":[1,{"c":"}"}]},"s":"x\\"}`},
		{"has the member", `{"a":1,"idempotency_replayed":false}` + "\n", `{"a":1,"idempotency_replayed":false}` + "\n"},
		{"has the member first", ` {"idempotency_replayed" : null}`, ` {"idempotency_replayed" : null}`},
		{"has the member, escaped", `{"a":[1,2],"idempotency\u005freplayed":0}`, `{"a":[1,2],"idempotency\u005freplayed":0}`},
		{"has the member, all escaped", `{"\u0069dempotency_r\u0065played":"x"}`, `{"\u0069dempotency_r\u0065played":"x"}`},
		{"an array", "[1,2]\n", "[1,2]\n"},
		{"a string", `"{}"`, `"{}"`},
		{"a number", `42`, `42`},
	} {
		got := string(markReplayed([]byte(c.in)))
		if got != c.want {
			t.Errorf("%s: %q replays as %q, want %q", c.name, c.in, got, c.want)
		}
		if json.Valid([]byte(c.in)) && !json.Valid([]byte(got)) {
			t.Errorf("%s: %q replays as invalid JSON %q", c.name, c.in, got)
		}
	}
}

// TestReplayIsTheBytesRecorded: through a route, a json.Encoder response
// replays with its trailing newline, members in their order and < > &
// unescaped; without the marker, byte for byte; a body that already has
// the member replays as it is, the header saying it is a replay.
func TestReplayIsTheBytesRecorded(t *testing.T) {
	t.Parallel()
	const body = `{"z":"<a href=\"x\">&</a>","a":{"idempotency_replayed":"nested"}}`
	for _, c := range []struct {
		name, body, want string
		noMarker         bool
	}{
		{"marker", body, `{"idempotency_replayed":true,` + body[1:] + "\n", false},
		{"no marker", body, body + "\n", true},
		{"has the member", `{"idempotency_replayed":"mine"}`, `{"idempotency_replayed":"mine"}` + "\n", false},
	} {
		h := newHarness(t, Config{})
		rt := h.route(RouteConfig{Name: "orders", NoReplayMarker: c.noMarker}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			enc := json.NewEncoder(w)
			enc.SetEscapeHTML(false)
			_ = enc.Encode(json.RawMessage(c.body))
		})
		first := send(t, rt, "POST", "/orders", testKey, `{}`)
		again := send(t, rt, "POST", "/orders", testKey, `{}`)
		if first.Body.String() != c.body+"\n" {
			t.Fatalf("%s: the first answer %q", c.name, first.Body)
		}
		if again.Code != 201 || again.Header().Get(HeaderReplayed) != "true" || again.Body.String() != c.want ||
			again.Header().Get("Content-Length") != itoa(len(c.want)) {
			t.Errorf("%s: replay %d %q (Replayed %q, Content-Length %q), want 201 %q", c.name, again.Code, again.Body,
				again.Header().Get(HeaderReplayed), again.Header().Get("Content-Length"), c.want)
		}
	}
}
