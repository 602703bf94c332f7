package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

// maxCandidates bounds the candidates an ambiguous inspect lists.
const maxCandidates = 100

// candidate is one row a search across scopes found.
type candidate struct {
	User      string    `json:"user"`
	Endpoint  string    `json:"endpoint"`
	Key       string    `json:"key"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

// searchKey finds keys (a UUID's stored forms) in every scope, on
// endpoint when it is set: WHERE idem_key = $1, announced on stderr and
// bounded by --timeout. It returns the one match; none is an error (exit
// 1); several are listed on stdout and refused (exit 2).
func (c *cli) searchKey(ctx context.Context, d *database, keys []string, endpoint optString) (candidate, error) {
	c.announceScan(d, "searching every scope for the key", true)
	conds := make([]string, len(keys))
	args := make([]any, 0, len(keys)+1)
	for i, k := range keys {
		conds[i] = fmt.Sprintf("idem_key = $%d", i+1)
		args = append(args, k)
	}
	q := `SELECT scope_user_id, scope_endpoint, idem_key, status, created_at FROM idempotency_keys WHERE (` +
		strings.Join(conds, " OR ") + ")"
	if endpoint.set {
		args = append(args, endpoint.v)
		q += fmt.Sprintf(" AND scope_endpoint = $%d", len(args))
	}
	q += fmt.Sprintf(" ORDER BY scope_user_id, scope_endpoint, idem_key LIMIT %d", maxCandidates+1)

	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	var (
		found []candidate
		x     candidate
	)
	err := d.query(sctx, q, args, []any{&x.User, &x.Endpoint, &x.Key, &x.Status, &x.CreatedAt}, func() error {
		found = append(found, x)
		return nil
	})
	if err != nil {
		return candidate{}, c.dbError(ctx, "search the key", err)
	}
	switch len(found) {
	case 0:
		where := ""
		if endpoint.set {
			where = fmt.Sprintf(" on endpoint %q", endpoint.v)
		}
		return candidate{}, fmt.Errorf("no key %s in any scope%s (a key in flight inside an open transaction is not visible)", keys[0], where)
	case 1:
		return found[0], nil
	}
	return candidate{}, c.ambiguous(keys[0], found)
}

// ambiguous lists the candidates of a search on stdout and returns the
// usage error that asks for a scope.
func (c *cli) ambiguous(key string, found []candidate) error {
	n := fmt.Sprint(len(found))
	if len(found) > maxCandidates {
		found, n = found[:maxCandidates], fmt.Sprintf("more than %d", maxCandidates)
	}
	if c.g.json {
		if err := c.writeJSON(struct {
			Key        string      `json:"key"`
			Candidates []candidate `json:"candidates"`
		}{key, found}); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "USER\tENDPOINT\tSTATUS\tCREATED")
		for _, f := range found {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", userCell(f.User), f.Endpoint, f.Status, f.CreatedAt.UTC().Format(time.RFC3339))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return usagef("key %s has %s rows across scopes and endpoints (listed on stdout): name one with --user ID or --unscoped, and --endpoint", key, n)
}

// userCell shows a user scope in a table: quoted, the unscoped one named.
func userCell(u string) string {
	if u == "" {
		return `"" (unscoped)`
	}
	return fmt.Sprintf("%q", u)
}
