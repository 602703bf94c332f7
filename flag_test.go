package idempotency

import "testing"

func TestFlagEnabled(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{
		"": true, "1": true, "true": true, "on": true, "yes": true, "anything": true,
		"0": false, "false": false, "FALSE": false, " off ": false, "No": false, "\tfalse\n": false,
	} {
		if got := flagEnabled(v); got != want {
			t.Fatalf("flagEnabled(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestEnabledFromEnv(t *testing.T) {
	t.Setenv(FlagEnv, "off")
	if EnabledFromEnv(t.Context()) {
		t.Fatal("off did not disable")
	}
	t.Setenv(FlagEnv, "1")
	if !EnabledFromEnv(t.Context()) {
		t.Fatal("1 did not enable")
	}
}
