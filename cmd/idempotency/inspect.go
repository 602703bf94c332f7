package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idempotency"
)

func inspectHelp(w io.Writer) {
	fmt.Fprint(w, `Usage: idempotency inspect --key KEY [--user ID | --unscoped] [--endpoint E] [--show-body] [flags]

Shows the stored rows of one key in one user scope (--user ID, or
--unscoped for keys stored without a user), one per endpoint unless
--endpoint picks one: status, attempt, recorded response code, times, and
the derive key id it was claimed under (when Config.DeriveKeys was set),
whether the row is stale (in flight past its lease: a retry answers
outcome_unknown) or expired (a retry would be a new request), both judged
by the database's clock. The response body and headers are shown only with
--show-body, a sealed one opened with the keys of IDEMPOTENCY_SEAL_KEYS or
--seal-keys-file (without the key it is shown as sealed, with its key id).

Without --user or --unscoped it searches every scope (WHERE idem_key = KEY;
on PostgreSQL a sequential scan, which it announces on stderr), bounded by
--timeout. One match is shown as above. Several are listed (user, endpoint,
status, created; --json: {"key", "candidates"}) and refused with exit
status 2: name one with --user or --unscoped, and --endpoint. No row is
"no key" with exit status 1 (--json still prints the document, rows []).

A transactional route's key is in flight inside its handler's open
transaction, which no other session can see. On PostgreSQL, with --user or
--unscoped and --endpoint, when no row is found, inspect probes for it: it
inserts the key in a transaction of its own that it always rolls back,
waiting up to 1s (3s on Citus), and shows
the session that holds the key (pg_blocking_pids, or on Citus
citus_lock_waits and citus_stat_activity: pid, application, client, since
when), or that one it could not identify holds it. A probe that fails
otherwise is an error: whether the key is held is then unknown. A key held
so is exit status 0. Without the probe it changes nothing. It works on
PostgreSQL and MySQL/MariaDB (there without the probe).

KEY is a UUID in its 36-character form, any case (matched as a UUID route
stores it, lower case, and as an opaque route stores it, exactly), or an
opaque key of 1-255 visible ASCII characters or spaces, matched exactly;
either optionally in double quotes as clients may send it.

Example:
  idempotency inspect --user 42 --key 0b3e1a5c-7a1f-4c1e-9f3d-2f6a8c9b1d20
`)
}

// inspectRow is one row as inspect --json shows it.
type inspectRow struct {
	recordJSON
	ResponseBodyBytes int64 `json:"response_body_bytes"`
	// SealKeyID names the key of a sealed response the CLI could not open
	// (response_body_kind "sealed").
	SealKeyID string `json:"seal_key_id,omitempty"`
	Stale     bool   `json:"stale"`   // in_flight with its lease over
	Expired   bool   `json:"expired"` // expires_at has passed: a retry is a new request
	// DeriveKeyID is the derive key id active when the row was claimed
	// (docs/derived-keys.md); absent for a row claimed without derive keys.
	DeriveKeyID string `json:"derive_key_id,omitempty"`
}

func runInspect(ctx context.Context, c *cli, args []string) error {
	flags := c.flagSet("inspect")
	var key, endpoint optString
	flags.Var(&key, "key", "the Idempotency-Key `KEY`, a UUID or an opaque key; required")
	user, unscoped := scopeVars(flags, "inspect")
	flags.Var(&endpoint, "endpoint", "only this `ENDPOINT` (scope_endpoint, e.g. 'POST /api/trading/orders')")
	showBody := flags.Bool("show-body", false, "also show the recorded response body and headers")
	pos, err := c.parse(flags, args, inspectHelp)
	if err != nil {
		return err
	}
	if err := noArgs("inspect", pos); err != nil {
		return err
	}
	if !key.set {
		return usagef("--key is required (see idempotency inspect --help)")
	}
	keys, err := parseKey(key.v)
	if err != nil {
		return err
	}
	scope, scoped, err := optionalScope("inspect", *user, *unscoped)
	if err != nil {
		return err
	}
	d, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer d.Close()
	if !scoped {
		found, err := c.searchKey(ctx, d, keys, endpoint)
		if err != nil {
			return err
		}
		// The one match: shown as a scoped inspect of its row shows it.
		scope, endpoint = found.User, optString{v: found.Endpoint, set: true}
	}
	return c.showKey(ctx, d, keys, scope, endpoint, *showBody)
}

// showKey prints the rows of keys (a UUID's stored forms) in scope, on
// endpoint when it is set. No row is an error (exit 1), unless the probe
// finds the key in flight inside an open transaction.
func (c *cli) showKey(ctx context.Context, d *database, keys []string, scope string, endpoint optString, showBody bool) error {
	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	ring, err := c.sealKeys()
	if err != nil {
		return err
	}
	var (
		out []inspectRow
		now time.Time
	)
	for _, k := range keys { // a UUID's two stored forms
		found, at, err := d.lookup(sctx, ring, k, scope, endpoint.v)
		if err != nil {
			return c.dbError(ctx, "read the key", err)
		}
		for _, rec := range found {
			if endpoint.set && rec.Endpoint != endpoint.v {
				continue // --endpoint '': Lookup reads every endpoint, the CLI shows none
			}
			out = append(out, newInspectRow(rec, showBody))
		}
		now = at
	}
	slices.SortStableFunc(out, func(a, b inspectRow) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	// No committed row: a transactional route's handler may hold the key
	// in flight inside its open transaction, which only a probe finds
	// (PostgreSQL only).
	var probe probeResult
	if len(out) == 0 && endpoint.set && d.pool != nil {
		if probe, err = probeOpenTransaction(ctx, d.pool, keys[0], scope, endpoint.v); err != nil {
			if ctx.Err() == nil && errors.Is(err, errProbe) {
				return fmt.Errorf("probe for an open transaction failed: %s: %v", pgMessage(err), errProbe)
			}
			return c.dbError(ctx, "probe for an open transaction", err)
		}
	}
	if c.g.json {
		if err := c.writeInspectJSON(keys[0], scope, out, probe); err != nil {
			return err
		}
	} else if probe.held {
		c.printOpenOwner(probe)
	}
	if len(out) == 0 && !probe.held {
		return noKeyError(keys[0], scope, endpoint, d.pool != nil)
	}
	if c.g.json {
		return nil
	}
	for i, r := range out {
		if i > 0 {
			fmt.Fprintln(c.stdout)
		}
		c.printInspectRow(r, now, showBody)
	}
	return nil
}

// writeInspectJSON writes inspect's --json document.
func (c *cli) writeInspectJSON(key, scope string, out []inspectRow, probe probeResult) error {
	if out == nil {
		out = []inspectRow{}
	}
	return c.writeJSON(struct {
		Key  string       `json:"key"`
		User string       `json:"user"`
		Rows []inspectRow `json:"rows"`
		// OpenTransaction: no committed row, but the key is in flight
		// inside this session's open transaction (--endpoint only).
		OpenTransaction *openOwner `json:"open_transaction,omitempty"`
		// HeldUnidentified: no committed row, and the probe's insert
		// waited its whole bound on a transaction it could not name.
		HeldUnidentified bool `json:"held_by_unidentified_transaction,omitempty"`
	}{key, scope, out, probe.owner, probe.held && probe.owner == nil})
}

// noKeyError is inspect's answer when a scope has no row of the key.
func noKeyError(key, scope string, endpoint optString, postgres bool) error {
	where, hint := "", ""
	if endpoint.set {
		where = fmt.Sprintf(" on endpoint %q", endpoint.v)
	}
	switch {
	case !postgres:
		hint = " (a key in flight inside an open transaction is not visible)"
	case !endpoint.set:
		hint = " (a key in flight inside an open transaction is not visible: --endpoint probes for it)"
	}
	return fmt.Errorf("no key %s in %s%s%s", key, describeUser(scope), where, hint)
}

// newInspectRow converts a row; the body and headers only with showBody.
func newInspectRow(rec idempotency.Record, showBody bool) inspectRow {
	r := inspectRow{
		recordJSON:        newRecordJSON(rec),
		ResponseBodyBytes: int64(len(rec.Response.Body)),
		Stale:             rec.Status == idempotency.StatusInFlight && rec.LeaseOver,
		Expired:           rec.Expired,
		DeriveKeyID:       rec.DeriveKeyID,
	}
	switch {
	case rec.Response.SealKeyID != "":
		// Not opened: its bytes are ciphertext, never shown as the body.
		r.ResponseBodyKind, r.SealKeyID = "sealed", rec.Response.SealKeyID
		r.ResponseHeaders, r.ResponseBody, r.ResponseBodyBase64 = nil, nil, nil
	case rec.Response.BodyKind == idempotency.BodyJSON:
		r.ResponseBodyKind = "json"
	case rec.Response.BodyKind == idempotency.BodyRaw:
		r.ResponseBodyKind = "raw"
	}
	if !showBody {
		r.ResponseHeaders, r.ResponseBody, r.ResponseBodyBase64 = nil, nil, nil
	}
	return r
}

func (c *cli) printInspectRow(r inspectRow, now time.Time, showBody bool) {
	w := c.stdout
	line := func(name, format string, args ...any) {
		fmt.Fprintf(w, "%-10s %s\n", name, fmt.Sprintf(format, args...))
	}
	line("key", "%s", r.Key)
	if r.User == "" {
		line("user", "'' (unscoped)")
	} else {
		line("user", "%s", r.User)
	}
	line("endpoint", "%s", r.Endpoint)
	line("status", "%s", r.Status)
	line("attempt", "%d", r.Attempt)
	switch {
	case r.ResponseCode == nil:
		line("response", "none recorded")
	case r.ResponseBodyKind == "sealed":
		line("response", "%d, sealed with key id %s, not opened (give that key in %s or --seal-keys-file)", *r.ResponseCode, r.SealKeyID, envSealKeys)
	case r.ResponseBodyKind == "none":
		line("response", "%d, no body stored (too large: replays answer 409 idempotency_response_not_stored)", *r.ResponseCode)
	default:
		line("response", "%d, %s body, %d bytes", *r.ResponseCode, r.ResponseBodyKind, r.ResponseBodyBytes)
	}
	line("created", "%s", when(r.CreatedAt, now))
	line("locked", "%s", when(r.LockedAt, now))
	if r.Status == string(idempotency.StatusInFlight) {
		line("lease end", "%s", when(r.LockedUntil, now))
	}
	line("expires", "%s", when(r.ExpiresAt, now))
	if r.DeriveKeyID != "" {
		line("derive key", "%s", r.DeriveKeyID)
	}
	switch {
	// What a retry of a stale row meets: an expired row is taken over as
	// a new request; any other answers outcome_unknown until it expires.
	case r.Stale && r.Expired:
		line("stale", "YES: in flight past its lease, and expired: a retry is a new request")
	case r.Stale:
		line("stale", "YES: in flight past its lease; the outcome is unknown (clients get 409 idempotency_outcome_unknown)")
	case r.Status == string(idempotency.StatusInFlight):
		line("stale", "no (in flight, lease running)")
	default:
		line("stale", "no")
	}
	if r.Expired {
		line("expired", "YES: a retry is a new request; cleanup will delete the row")
	} else {
		line("expired", "no")
	}
	if !showBody {
		return
	}
	if len(r.ResponseHeaders) > 0 {
		names := make([]string, 0, len(r.ResponseHeaders))
		for name := range r.ResponseHeaders {
			names = append(names, name)
		}
		slices.Sort(names)
		for i, name := range names {
			label := ""
			if i == 0 {
				label = "headers"
			}
			line(label, "%s: %s", name, strings.Join(r.ResponseHeaders[name], ", "))
		}
	}
	switch {
	case r.ResponseBody != nil:
		line("body", "%s", r.ResponseBody)
	case r.ResponseBodyBase64 != nil:
		raw, _ := base64.StdEncoding.DecodeString(*r.ResponseBodyBase64)
		if printable(raw) {
			line("body", "%q", raw)
		} else {
			line("body", "base64 %s", *r.ResponseBodyBase64)
		}
	}
}

// when formats t in UTC with its distance from the database's now.
func when(t, now time.Time) string {
	s := t.UTC().Format(time.RFC3339)
	if now.IsZero() {
		return s
	}
	d := t.Sub(now)
	if d >= 0 {
		return fmt.Sprintf("%s (in %v)", s, roundAge(d))
	}
	return fmt.Sprintf("%s (%v ago)", s, roundAge(-d))
}

// roundAge formats a duration for reading: milliseconds under a second,
// seconds under an hour, minutes beyond (4m3s, 25h10m).
func roundAge(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
}

// printable reports text that can be shown quoted.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return false
		}
	}
	return true
}
