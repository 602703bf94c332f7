package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"
)

func statsHelp(w io.Writer) {
	fmt.Fprint(w, `Usage: idempotency stats [flags]

Counts the stored keys: by status; the age of the oldest in-flight claim
(since its locked_at); keys in flight past their lease (stale: a server died
mid-request or could not record the response; the outcome is unknown); and
expired keys waiting for cleanup (what cleanup would delete now), with the
oldest expiry. All judged by the database's clock. Then the completed keys
by the seal key id their response is sealed with ("none": plaintext,
recorded before sealing), with a warning for a key id past 2^31 values
(AES-GCM with random nonces allows 2^32 per key: rotate well before). Then
the keys by the derive key id their row names ("none": claimed without
derive keys): a derive key may leave IDEMPOTENCY_DERIVE_KEYS once no row
names it (docs/derived-keys.md). Three read-only scans of the table.

Example:
  idempotency stats --json
`)
}

type statsJSON struct {
	Total    int64 `json:"total"`
	ByStatus struct {
		InFlight  int64 `json:"in_flight"`
		Completed int64 `json:"completed"`
		Failed    int64 `json:"failed"`
	} `json:"by_status"`
	OldestInFlightAgeSeconds *float64 `json:"oldest_in_flight_age_seconds"` // null when none is in flight
	InFlightPastLease        int64    `json:"in_flight_past_lease"`
	AwaitingCleanup          int64    `json:"awaiting_cleanup"`
	OldestExpiredAgeSeconds  *float64 `json:"oldest_expired_age_seconds"` // how long the oldest has waited; null when none
	// CompletedBySealKey counts completed keys by seal key id; "" is
	// plaintext (recorded before sealing).
	CompletedBySealKey map[string]int64 `json:"completed_by_seal_key"`
	// KeysByDeriveKey counts keys by the derive key id their row names;
	// "" is none.
	KeysByDeriveKey map[string]int64 `json:"keys_by_derive_key"`
}

func runStats(ctx context.Context, c *cli, args []string) error {
	flags := c.flagSet("stats")
	pos, err := c.parse(flags, args, statsHelp)
	if err != nil {
		return err
	}
	if err := noArgs("stats", pos); err != nil {
		return err
	}

	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()

	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	st, err := db.stats(sctx)
	if err != nil {
		return c.dbError(ctx, "count keys", err)
	}
	s := newStatsJSON(st)
	if s.CompletedBySealKey, err = db.sealStats(sctx); err != nil {
		return c.dbError(ctx, "count keys by seal key", err)
	}
	c.warnNonceBudget(s.CompletedBySealKey)
	if s.KeysByDeriveKey, err = db.deriveStats(sctx); err != nil {
		return c.dbError(ctx, "count keys by derive key", err)
	}
	if c.g.json {
		return c.writeJSON(s)
	}

	age := func(secs *float64) string {
		if secs == nil {
			return "-"
		}
		return roundAge(time.Duration(*secs * float64(time.Second)))
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "keys\t%d\n", s.Total)
	fmt.Fprintf(tw, "  in_flight\t%d\n", s.ByStatus.InFlight)
	fmt.Fprintf(tw, "  completed\t%d\n", s.ByStatus.Completed)
	fmt.Fprintf(tw, "  failed\t%d\n", s.ByStatus.Failed)
	fmt.Fprintf(tw, "oldest in-flight claim\t%s\n", age(s.OldestInFlightAgeSeconds))
	fmt.Fprintf(tw, "in flight past lease (stale)\t%d\n", s.InFlightPastLease)
	fmt.Fprintf(tw, "expired, awaiting cleanup\t%d\n", s.AwaitingCleanup)
	fmt.Fprintf(tw, "oldest awaiting cleanup\t%s\n", ageSuffix(age(s.OldestExpiredAgeSeconds)))
	fmt.Fprintf(tw, "completed, by seal key id\t\n")
	for _, id := range slices.Sorted(maps.Keys(s.CompletedBySealKey)) {
		fmt.Fprintf(tw, "  %s\t%d\n", cmp.Or(id, "none (plaintext)"), s.CompletedBySealKey[id])
	}
	fmt.Fprintf(tw, "keys, by derive key id\t\n")
	for _, id := range slices.Sorted(maps.Keys(s.KeysByDeriveKey)) {
		fmt.Fprintf(tw, "  %s\t%d\n", cmp.Or(id, "none"), s.KeysByDeriveKey[id])
	}
	return tw.Flush()
}

// deriveStatsSQL counts keys by the derive key id their row names (empty:
// none); both dialects run it as it is.
const deriveStatsSQL = `SELECT derive_key_id, count(*) FROM idempotency_keys GROUP BY derive_key_id`

// deriveStats reads deriveStatsSQL.
func (d *database) deriveStats(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	var (
		id string
		n  int64
	)
	err := d.query(ctx, deriveStatsSQL, nil, []any{&id, &n}, func() error {
		out[id] = n
		return nil
	})
	return out, err
}

// newStatsJSON converts the store's counts; an age is null when nothing is
// counted for it.
func newStatsJSON(st tableStats) statsJSON {
	var s statsJSON
	s.Total = st.Total
	s.ByStatus.InFlight, s.ByStatus.Completed, s.ByStatus.Failed = st.InFlight, st.Completed, st.Failed
	s.InFlightPastLease, s.AwaitingCleanup = st.InFlightPastLease, st.AwaitingCleanup
	if st.InFlight > 0 {
		v := st.OldestInFlightAge.Seconds()
		s.OldestInFlightAgeSeconds = &v
	}
	if st.AwaitingCleanup > 0 {
		v := st.OldestExpiredAge.Seconds()
		s.OldestExpiredAgeSeconds = &v
	}
	return s
}

// ageSuffix adds "past expiry" to a known age.
func ageSuffix(a string) string {
	if a == "-" {
		return a
	}
	return a + " past expiry"
}
