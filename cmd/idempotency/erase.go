package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

func eraseHelp(w io.Writer) {
	fmt.Fprint(w, `Usage: idempotency erase (--user ID | --unscoped) [flags]

Deletes every stored key of one user scope, with its recorded request hash and
response: the erasure step of a GDPR request. --user ID names the user;
--unscoped erases the keys stored without a user instead. An empty --user is
refused (exit status 2), so an unset variable in --user "$USER_ID" never
erases every unscoped key.

A key whose request is running right now (in_flight, lease not over) is left
in place, so the running request can still finish; such keys are listed (key,
endpoint, lease end) and the exit status is still 0. Run erase again after the
latest lease end to remove them: by then they are completed, failed or stale,
and erased like any other. A key the client retries after erasure is new.

Example:
  idempotency erase --user 42
`)
}

func runErase(ctx context.Context, c *cli, args []string) error {
	scope, err := parseScopeCommand(c, "erase", args, eraseHelp, "erase")
	if err != nil {
		return err
	}

	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()

	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	res, err := db.store.Erase(sctx, scope)
	if err != nil {
		return c.dbError(ctx, "delete the user's keys", err)
	}

	skipped := make([]skippedJSON, len(res.Skipped))
	var retryAfter time.Time
	for i, r := range res.Skipped {
		skipped[i] = skippedJSON{Key: r.Key, Endpoint: r.Endpoint, LockedUntil: r.LockedUntil.UTC()}
		if r.LockedUntil.After(retryAfter) {
			retryAfter = r.LockedUntil
		}
	}
	if c.g.json {
		out := struct {
			User       string        `json:"user"`
			Deleted    int64         `json:"deleted"`
			Skipped    []skippedJSON `json:"skipped"`
			RetryAfter *time.Time    `json:"retry_after"` // the latest lease end; null when nothing was skipped
		}{User: scope, Deleted: res.Deleted, Skipped: skipped}
		if len(skipped) > 0 {
			t := retryAfter.UTC()
			out.RetryAfter = &t
		}
		return c.writeJSON(out)
	}

	fmt.Fprintf(c.stdout, "erased %d %s of %s\n", res.Deleted, rows(res.Deleted), describeUser(scope))
	if len(skipped) == 0 {
		return nil
	}
	n := int64(len(skipped))
	fmt.Fprintf(c.stdout, "SKIPPED %d in-flight %s (a request is running; lease not over). Run erase again after %s:\n",
		n, rows(n), retryAfter.UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  KEY\tENDPOINT\tLOCKED_UNTIL")
	for _, s := range skipped {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.Key, s.Endpoint, s.LockedUntil.Format(time.RFC3339))
	}
	return tw.Flush()
}
