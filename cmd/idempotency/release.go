package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/idemkit/idempotency"
)

func releaseHelp(w io.Writer) {
	fmt.Fprint(w, `Usage: idempotency release --key KEY (--user ID | --unscoped) [--endpoint E] --yes [flags]

Releases one stuck key: deletes its row when it is failed, or in flight past
its lease (stale), so the client's next retry with the key executes the
request again. It first prints the row and a warning; without --yes it stops
there (exit status 2). It refuses a completed key (retries replay it) and a
key in flight inside its lease (a request is running), with exit status 1.
The delete is fenced: it happens only if the row is still as printed (same
attempt, still failed or stale), else nothing is released (exit status 1).
Each release is logged on stderr.

WARNING: for a stale in-flight key the first attempt's outcome is unknown:
on an ordinary route it may have run, and the retry then runs it a second
time. Release such a key only once you know the first attempt did nothing
(look the operation up first). A failed key's retry is a new attempt.

KEY is a UUID (any case) or an opaque key, as inspect takes it. The scope
is named, never searched: --user ID, or --unscoped for a key stored without
a user (inspect --key KEY finds the scope of a key). A key with rows on
several endpoints needs --endpoint. It works on PostgreSQL and
MySQL/MariaDB.

Example:
  idempotency release --user 42 --key 0b3e1a5c-7a1f-4c1e-9f3d-2f6a8c9b1d20 --yes
`)
}

// releaseWarning is printed before every release.
const releaseWarning = "releasing deletes this row: the client's next retry of this key executes the request again; " +
	"for a stale in-flight key on an ordinary route the first attempt may have run, so the retry may be a second execution"

func runRelease(ctx context.Context, c *cli, args []string) error {
	flags := c.flagSet("release")
	var key, endpoint optString
	flags.Var(&key, "key", "the Idempotency-Key `KEY`, a UUID or an opaque key; required")
	user, unscoped := scopeVars(flags, "release")
	flags.Var(&endpoint, "endpoint", "the row's `ENDPOINT` (scope_endpoint), when the key has rows on several")
	yes := flags.Bool("yes", false, "confirm the release")
	pos, err := c.parse(flags, args, releaseHelp)
	if err != nil {
		return err
	}
	if err := noArgs("release", pos); err != nil {
		return err
	}
	if !key.set {
		return usagef("--key is required (see idempotency release --help)")
	}
	keys, err := parseKey(key.v)
	if err != nil {
		return err
	}
	scope, err := scopeFlags("release", *user, *unscoped)
	if err != nil {
		return err
	}
	d, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer d.Close()
	rec, err := c.releaseRow(ctx, d, keys, scope, endpoint)
	if err != nil {
		return err
	}
	c.printReleaseRow(rec)
	switch {
	case rec.Status == idempotency.StatusCompleted:
		return fmt.Errorf("the key is completed: its retries replay the recorded response; nothing to release")
	case !releasable(rec):
		return fmt.Errorf("the key is in flight and its lease runs until %s: a request is running; not released (run again after the lease if it stays in flight)",
			rec.LockedUntil.UTC().Format(time.RFC3339))
	}
	if !c.g.json {
		fmt.Fprintln(c.stdout, "WARNING: "+releaseWarning)
	}
	if !*yes {
		return usagef("pass --yes to release it")
	}
	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	released, err := d.releaseKey(sctx, rec.Fence())
	if err != nil {
		return c.dbError(ctx, "release the key", err)
	}
	if !released {
		return fmt.Errorf("the row changed since it was read (finished, taken over or deleted): nothing released; inspect it again")
	}
	slog.New(slog.NewTextHandler(c.stderr, nil)).WarnContext(ctx, "idempotency release: key released; its next retry executes again",
		"key", rec.Key, "user", rec.Scope, "endpoint", rec.Endpoint, "status", string(rec.Status), "attempt", rec.Attempt,
		"locked_until", rec.LockedUntil.UTC())
	if c.g.json {
		return c.writeJSON(struct {
			Released bool       `json:"released"`
			Row      recordJSON `json:"row"`
			Warning  string     `json:"warning"`
		}{true, newRecordJSON(rec), releaseWarning})
	}
	_, err = fmt.Fprintf(c.stdout, "released key %s of %s on %q\n", rec.Key, describeUser(rec.Scope), rec.Endpoint)
	return err
}

// releaseRow reads the one row release is about: keys (a UUID's stored
// forms) in scope, on endpoint when it is set. None is an error (exit 1),
// several a usage error that asks for --endpoint.
func (c *cli) releaseRow(ctx context.Context, d *database, keys []string, scope string, endpoint optString) (idempotency.Record, error) {
	var recs []idempotency.Record
	for _, k := range keys {
		sctx, cancel := c.statementContext(ctx)
		found, _, err := d.lookup(sctx, nil, k, scope, endpoint.v)
		cancel()
		if err != nil {
			return idempotency.Record{}, c.dbError(ctx, "read the key", err)
		}
		for _, r := range found {
			if !endpoint.set || r.Endpoint == endpoint.v {
				recs = append(recs, r)
			}
		}
	}
	switch {
	case len(recs) == 0:
		where := ""
		if endpoint.set {
			where = fmt.Sprintf(" on endpoint %q", endpoint.v)
		}
		return idempotency.Record{}, fmt.Errorf("no row for key %s in %s%s: nothing to release", keys[0], describeUser(scope), where)
	case len(recs) > 1:
		eps := make([]string, len(recs))
		for i, r := range recs {
			eps[i] = fmt.Sprintf("%q", r.Endpoint)
		}
		return idempotency.Record{}, usagef("key %s has %d rows in %s (endpoints %s): pick one with --endpoint", keys[0], len(recs), describeUser(scope), strings.Join(eps, ", "))
	}
	return recs[0], nil
}

// releasable reports whether an operator may release rec: it is failed, or
// in_flight with its lease over. A completed key replays and a live one is
// running: neither is released (the store's fenced DELETE checks it again).
func releasable(rec idempotency.Record) bool {
	return rec.Status == idempotency.StatusFailed || rec.Status == idempotency.StatusInFlight && rec.LeaseOver
}

// printReleaseRow shows the row a release is about (text output only).
func (c *cli) printReleaseRow(r idempotency.Record) {
	if c.g.json {
		return
	}
	line := func(name, format string, args ...any) {
		fmt.Fprintf(c.stdout, "%-12s %s\n", name, fmt.Sprintf(format, args...))
	}
	line("key", "%s", r.Key)
	line("user", "%s", describeUser(r.Scope))
	line("endpoint", "%s", r.Endpoint)
	status := string(r.Status)
	if r.Status == idempotency.StatusInFlight && r.LeaseOver {
		status += " (stale: past its lease; outcome unknown)"
	}
	line("status", "%s", status)
	line("attempt", "%d", r.Attempt)
	line("created_at", "%s", r.CreatedAt.UTC().Format(time.RFC3339))
	line("locked_until", "%s", r.LockedUntil.UTC().Format(time.RFC3339))
	line("expires_at", "%s", r.ExpiresAt.UTC().Format(time.RFC3339))
}
