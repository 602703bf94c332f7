package idempotency

import (
	"strings"
	"testing"
)

// TestJSONBMayRefuse: the cautious record's test for JSON that JSONB might
// refuse flags escapes, exponents and long numbers, never words or strings.
func TestJSONBMayRefuse(t *testing.T) {
	for body, want := range map[string]bool{
		`{"qty":1,"price":187.43,"ok":true,"no":false,"n":null}`: false,
		`{"note":"1e5 is a string, so is \"E\""}`:                false,
		`[-0.5,1,2,3]`:               false,
		`{"qty":1e5}`:                true,
		`[1E-3]`:                     true,
		`{"s":"caf\u00e9"}`:          true,
		`{"s":"back\\slash then u"}`: false,
		`{"p":` + strings.Repeat("9", maxJSONBNumber) + `}`:   false,
		`{"p":` + strings.Repeat("9", maxJSONBNumber+1) + `}`: true,
	} {
		if got := jsonbMayRefuse([]byte(body)); got != want {
			t.Errorf("jsonbMayRefuse(%.60s) = %v, want %v", body, got, want)
		}
	}
}
