package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

func listHelp(w io.Writer) {
	fmt.Fprint(w, `Usage: idempotency list (--stale | --failed | --counts) [--user ID | --unscoped] [--endpoint E] [--limit N] [flags]

Lists keys for an operator, by the database's clock:
  --stale   in-flight keys whose lease is over: their outcome is unknown and
            retries answer 409 idempotency_outcome_unknown until they expire
            or are released. By endpoint, oldest claim first, with the age
            of the claim and how long its lease has been over.
  --failed  failed keys (a retry executes again), by endpoint, oldest first.
  --counts  per endpoint: keys in flight (lease running), stale, completed,
            failed, and the total.

Without --user or --unscoped it reads every scope, which on PostgreSQL is a
sequential scan of the table (no index leads with the status); it says so
on stderr and is bounded by --timeout like every statement. --user ID or
--unscoped reads one scope through the table's index. At most --limit rows
are printed; when there are more, stderr says so.

With --json it prints JSON lines: one object per row, no enclosing
document, as export does (nothing when there are no rows). Works on
PostgreSQL and MySQL/MariaDB.

Example:
  idempotency list --stale --endpoint 'POST /api/trading/orders'
  idempotency list --counts --json
`)
}

// listRow is one key as list --stale and --failed print it.
type listRow struct {
	User        string    `json:"user"`
	Endpoint    string    `json:"endpoint"`
	Key         string    `json:"key"`
	Status      string    `json:"status"`
	Attempt     int32     `json:"attempt"`
	CreatedAt   time.Time `json:"created_at"`
	LockedAt    time.Time `json:"locked_at"`
	LockedUntil time.Time `json:"locked_until"`
	ExpiresAt   time.Time `json:"expires_at"`
	// AgeSeconds is how long ago the current attempt claimed the key.
	AgeSeconds float64 `json:"age_seconds"`
	// LeaseOverSeconds is how long the lease has been over (--stale).
	LeaseOverSeconds *float64 `json:"lease_over_seconds,omitempty"`
	Expired          bool     `json:"expired"` // a retry is a new request; cleanup deletes it
}

// listCount is one endpoint's line of list --counts.
type listCount struct {
	Endpoint  string `json:"endpoint"`
	InFlight  int64  `json:"in_flight"` // lease running
	Stale     int64  `json:"stale"`     // in flight, lease over
	Completed int64  `json:"completed"`
	Failed    int64  `json:"failed"`
	Total     int64  `json:"total"`
}

// listOpts are list's flags.
type listOpts struct {
	mode     string // stale, failed or counts
	scope    string
	scoped   bool
	endpoint optString
	limit    int
}

func runList(ctx context.Context, c *cli, args []string) error {
	o, err := c.parseList(args)
	if err != nil {
		return err
	}
	d, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer d.Close()
	if !o.scoped {
		c.announceScan(d, "listing every scope", false)
	}
	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	where, wargs := o.where()
	var n int
	if o.mode == "counts" {
		n, err = c.listCounts(sctx, d, o, where, wargs)
	} else {
		n, err = c.listKeys(sctx, d, o, where, wargs)
	}
	if err != nil {
		return c.dbError(ctx, "list the keys", err)
	}
	if n > o.limit {
		fmt.Fprintf(c.stderr, "more than %d rows: the first %d are shown (raise --limit)\n", o.limit, o.limit)
	}
	return nil
}

// parseList parses list's flags.
func (c *cli) parseList(args []string) (listOpts, error) {
	flags := c.flagSet("list")
	stale := flags.Bool("stale", false, "in-flight keys whose lease is over")
	failed := flags.Bool("failed", false, "failed keys")
	counts := flags.Bool("counts", false, "counts per endpoint and status")
	user, unscoped := scopeVars(flags, "list")
	var o listOpts
	flags.Var(&o.endpoint, "endpoint", "only this `ENDPOINT` (scope_endpoint)")
	flags.IntVar(&o.limit, "limit", 100, "print at most `N` rows, from 1 to 1000000")
	pos, err := c.parse(flags, args, listHelp)
	if err != nil {
		return o, err
	}
	if err := noArgs("list", pos); err != nil {
		return o, err
	}
	modes := 0
	for m, on := range map[string]bool{"stale": *stale, "failed": *failed, "counts": *counts} {
		if on {
			o.mode, modes = m, modes+1
		}
	}
	if modes != 1 {
		return o, usagef("give one of --stale, --failed or --counts (see idempotency list --help)")
	}
	if o.limit < 1 || o.limit > 1000000 {
		return o, usagef("--limit must be from 1 to 1000000, got %d", o.limit)
	}
	o.scope, o.scoped, err = optionalScope("list", *user, *unscoped)
	return o, err
}

// where returns the conditions of o's scope and endpoint, and their
// arguments ($1, $2).
func (o listOpts) where() (string, []any) {
	var (
		w    string
		args []any
	)
	if o.scoped {
		args = append(args, o.scope)
		w += fmt.Sprintf(" AND scope_user_id = $%d", len(args))
	}
	if o.endpoint.set {
		args = append(args, o.endpoint.v)
		w += fmt.Sprintf(" AND scope_endpoint = $%d", len(args))
	}
	return w, args
}

// listKeys prints the stale or failed keys and returns how many rows it
// read (at most limit+1).
func (c *cli) listKeys(ctx context.Context, d *database, o listOpts, where string, args []any) (int, error) {
	cond := "status = 'failed'"
	if o.mode == "stale" {
		cond = "status = 'in_flight' AND locked_until < {now}"
	}
	q := `SELECT scope_user_id, scope_endpoint, idem_key, status, attempt, created_at, locked_at, locked_until, expires_at, {now}
FROM idempotency_keys WHERE ` + cond + where + fmt.Sprintf(`
ORDER BY scope_endpoint, locked_at, scope_user_id, idem_key LIMIT %d`, o.limit+1)
	var (
		rows []listRow
		x    listRow
		now  time.Time
	)
	err := d.query(ctx, q, args, []any{&x.User, &x.Endpoint, &x.Key, &x.Status, &x.Attempt, &x.CreatedAt, &x.LockedAt,
		&x.LockedUntil, &x.ExpiresAt, &now}, func() error {
		r := x
		r.AgeSeconds = now.Sub(r.LockedAt).Seconds()
		if o.mode == "stale" {
			over := now.Sub(r.LockedUntil).Seconds()
			r.LeaseOverSeconds = &over
		}
		r.Expired = !r.ExpiresAt.After(now)
		rows = append(rows, r)
		return nil
	})
	if err != nil {
		return 0, err
	}
	n := len(rows)
	if n > o.limit {
		rows = rows[:o.limit]
	}
	return n, c.printListRows(o, rows)
}

// printListRows prints list's keys as a table or JSON lines.
func (c *cli) printListRows(o listOpts, rows []listRow) error {
	if c.g.json {
		return writeJSONLines(c.stdout, rows)
	}
	if len(rows) == 0 {
		_, err := fmt.Fprintf(c.stdout, "no %s keys\n", map[string]string{"stale": "stale in-flight", "failed": "failed"}[o.mode])
		return err
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	stale := o.mode == "stale"
	if stale {
		fmt.Fprintln(tw, "ENDPOINT\tAGE\tLEASE OVER\tUSER\tKEY\tATTEMPT\tEXPIRED")
	} else {
		fmt.Fprintln(tw, "ENDPOINT\tAGE\tUSER\tKEY\tATTEMPT\tEXPIRED")
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t", r.Endpoint, roundAge(seconds(r.AgeSeconds)))
		if stale {
			fmt.Fprintf(tw, "%s\t", roundAge(seconds(*r.LeaseOverSeconds)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", userCell(r.User), r.Key, r.Attempt, map[bool]string{true: "yes", false: "no"}[r.Expired])
	}
	return tw.Flush()
}

// listCounts prints the counts per endpoint and returns how many
// endpoints it read (at most limit+1).
func (c *cli) listCounts(ctx context.Context, d *database, o listOpts, where string, args []any) (int, error) {
	q := `SELECT scope_endpoint,
	SUM(CASE WHEN status = 'in_flight' AND locked_until >= {now} THEN 1 ELSE 0 END),
	SUM(CASE WHEN status = 'in_flight' AND locked_until < {now} THEN 1 ELSE 0 END),
	SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END),
	SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END),
	COUNT(*)
FROM idempotency_keys WHERE TRUE` + where + fmt.Sprintf(`
GROUP BY scope_endpoint ORDER BY scope_endpoint LIMIT %d`, o.limit+1)
	var (
		out []listCount
		x   listCount
	)
	err := d.query(ctx, q, args, []any{&x.Endpoint, &x.InFlight, &x.Stale, &x.Completed, &x.Failed, &x.Total}, func() error {
		out = append(out, x)
		return nil
	})
	if err != nil {
		return 0, err
	}
	n := len(out)
	if n > o.limit {
		out = out[:o.limit]
	}
	if c.g.json {
		return n, writeJSONLines(c.stdout, out)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tIN FLIGHT\tSTALE\tCOMPLETED\tFAILED\tTOTAL")
	for _, r := range out {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", r.Endpoint, r.InFlight, r.Stale, r.Completed, r.Failed, r.Total)
	}
	return n, tw.Flush()
}

// seconds converts a JSON field's seconds back to a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// writeJSONLines writes each of rows as one JSON object on a line.
func writeJSONLines[T any](w io.Writer, rows []T) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
