package idempotency

import (
	"context"
	"os"
	"strings"
)

// FlagEnv is the environment variable read by EnabledFromEnv: the
// kill-switch.
const FlagEnv = "FLAG_IDEMPOTENCY_MIDDLEWARE"

// EnabledFromEnv is the default kill-switch: false when
// FLAG_IDEMPOTENCY_MIDDLEWARE is "0", "false", "off" or "no" (any case and
// spacing), else true.
func EnabledFromEnv(context.Context) bool {
	return flagEnabled(os.Getenv(FlagEnv))
}

func flagEnabled(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "0", "false", "off", "no":
		return false
	}
	return true
}
