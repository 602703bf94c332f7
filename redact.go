package idempotency

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
)

// identifier returns a key or scope as logs and Observations show it:
// itself, its HMAC-SHA256 under Config.IdentifierSecret (hex), or "" with
// Config.OmitIdentifiers.
func (m *Middleware) identifier(v string) string {
	switch {
	case m.cfg.OmitIdentifiers:
		return ""
	case len(m.cfg.IdentifierSecret) > 0:
		return identifierHMAC(m.cfg.IdentifierSecret, v)
	}
	return v
}

func identifierHMAC(secret []byte, v string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(v))
	return hex.EncodeToString(mac.Sum(nil))
}

// identifierHandler rewrites the "key" and "scope" attributes of the
// middleware's log records: left out, or replaced by "key_hmac" and
// "scope_hmac" holding their HMAC-SHA256 (a plain hash of a user id or a
// short key is reversed by trying every value; an HMAC needs the secret).
type identifierHandler struct {
	inner  slog.Handler
	secret []byte // nil: leave them out
}

// newLogger returns cfg's logger, with keys and scopes redacted as cfg
// asks. Without them, the requests a fail-open route ran without
// deduplication during an outage cannot be listed: that is said once.
func newLogger(cfg *Config) *slog.Logger {
	if cfg.OmitIdentifiers {
		cfg.Logger.WarnContext(context.Background(), "idempotency: Config.OmitIdentifiers is set: logs carry no keys or scopes, "+
			"so the requests a fail-open route runs without deduplication during an outage cannot be listed; "+
			"Config.IdentifierSecret logs their HMACs instead")
	}
	if !cfg.OmitIdentifiers && len(cfg.IdentifierSecret) == 0 {
		return cfg.Logger
	}
	var secret []byte
	if !cfg.OmitIdentifiers {
		secret = cfg.IdentifierSecret
	}
	return slog.New(identifierHandler{inner: cfg.Logger.Handler(), secret: secret})
}

// Enabled reports whether the wrapped handler takes records of level l.
func (h identifierHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

// Handle passes r on with its identifiers redacted.
func (h identifierHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if a, ok := h.redact(a); ok {
			out.AddAttrs(a)
		}
		return true
	})
	return h.inner.Handle(ctx, out)
}

// WithAttrs redacts attrs, then adds them to the wrapped handler.
func (h identifierHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	kept := make([]slog.Attr, 0, len(attrs))
	for _, a := range attrs {
		if a, ok := h.redact(a); ok {
			kept = append(kept, a)
		}
	}
	return identifierHandler{inner: h.inner.WithAttrs(kept), secret: h.secret}
}

// WithGroup opens a group on the wrapped handler.
func (h identifierHandler) WithGroup(name string) slog.Handler {
	return identifierHandler{inner: h.inner.WithGroup(name), secret: h.secret}
}

// redact returns a as it may be logged, and false when it is left out.
func (h identifierHandler) redact(a slog.Attr) (slog.Attr, bool) {
	if a.Key != "key" && a.Key != "scope" {
		return a, true
	}
	if h.secret == nil {
		return slog.Attr{}, false
	}
	return slog.String(a.Key+"_hmac", identifierHMAC(h.secret, a.Value.String())), true
}
