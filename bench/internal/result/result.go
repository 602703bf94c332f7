// Package result is what the bench tools share: the one-line SUMMARY they
// print, latency percentiles, and the loopback-only checks that keep every
// load on this machine.
package result

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Prefix starts the machine-readable line each tool prints last.
const Prefix = "SUMMARY "

// MaxDuration bounds every measured run, whatever the flags say.
const MaxDuration = 10 * time.Minute

// Summary is one measured run. Latencies are in milliseconds.
type Summary struct {
	Tool        string  `json:"tool"`              // loadgen, sqlfloor or pgbench
	Subject     string  `json:"subject,omitempty"` // A, B, C, P or a free label
	Mode        string  `json:"mode"`              // unique, nokey, hot, storm
	Concurrency int     `json:"concurrency"`
	DurationS   float64 `json:"duration_s"` // the measured window
	Requests    int64   `json:"requests"`   // answered as the mode expects inside the window
	RPS         float64 `json:"rps"`        // Requests per second of the window
	P50Ms       float64 `json:"p50_ms"`
	P90Ms       float64 `json:"p90_ms"`
	P99Ms       float64 `json:"p99_ms"`
	MaxMs       float64 `json:"max_ms"`

	Status     map[string]int64 `json:"status,omitempty"` // HTTP status -> count
	Replayed   int64            `json:"replayed,omitempty"`
	Errors     int64            `json:"errors"`     // transport or SQL errors, warm-up included
	Unexpected int64            `json:"unexpected"` // answers the mode does not expect, warm-up included

	// Storm only.
	Keys             int    `json:"keys,omitempty"`
	Copies           int    `json:"copies,omitempty"`
	Executions       int64  `json:"executions,omitempty"`        // fresh 201s (no Idempotent-Replayed)
	DoubleExecutions int    `json:"double_executions"`           // keys with more than one fresh 201
	OrdersInDB       *int   `json:"orders_in_db,omitempty"`      // GET /api/trading/orders, when verified
	VerifyError      string `json:"verify_error,omitempty"`      // what the verification found wrong
	KeysNotExecuted  int    `json:"keys_not_executed,omitempty"` // keys no copy executed

	// Database round trips (ReadyForQuery messages) and transactions per
	// request, when counted through pgrtt.
	RoundTripsPerReq float64 `json:"round_trips_per_req,omitempty"`
	XactsPerReq      float64 `json:"xacts_per_req,omitempty"`

	// CPU time per measured request, in microseconds, from /proc: the
	// server process, the measuring tool itself (loadgen or sqlfloor), and
	// everything else busy on the machine (PostgreSQL, and any other load);
	// and how busy all cores were over the window.
	CPUServerUs  float64 `json:"cpu_server_us,omitempty"`
	CPULoadgenUs float64 `json:"cpu_loadgen_us,omitempty"`
	CPUOtherUs   float64 `json:"cpu_other_us,omitempty"`
	// CPUDBUs is the database's share of CPUOtherUs when loadgen was given
	// the database's processes (-db-pids-cmd: the PostgreSQL backends of
	// the server under test); CPUOtherUs then excludes it.
	CPUDBUs        float64 `json:"cpu_db_us,omitempty"`
	MachineBusyPct float64 `json:"machine_busy_pct,omitempty"`
	// BackgroundBusyPct is how busy the cores were just before the load
	// started, with nothing of the run's own at work: other load on the
	// machine, which the figures then share it with.
	BackgroundBusyPct float64 `json:"background_busy_pct,omitempty"`

	Note string `json:"note,omitempty"`
}

// Print writes s as the SUMMARY line.
func (s Summary) Print(w io.Writer) {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // a Summary always marshals
	}
	fmt.Fprintf(w, "%s%s\n", Prefix, b)
}

// ReadSummaries returns every SUMMARY line in r, in order.
func ReadSummaries(r io.Reader) ([]Summary, error) {
	var out []Summary
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), Prefix)
		if !ok {
			continue
		}
		var s Summary
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			return nil, fmt.Errorf("bad summary line %q: %w", line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// Latencies collects request durations and reports percentiles.
type Latencies []time.Duration

// Fill sets the latency fields of s from l, which it sorts.
func (l Latencies) Fill(s *Summary) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	s.P50Ms = ms(l.at(0.50))
	s.P90Ms = ms(l.at(0.90))
	s.P99Ms = ms(l.at(0.99))
	s.MaxMs = ms(l[len(l)-1])
}

// at is the nearest-rank percentile of sorted l.
func (l Latencies) at(p float64) time.Duration {
	i := int(p*float64(len(l))+0.999999) - 1
	return l[min(max(i, 0), len(l)-1)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// ErrNotLoopback is returned for any target off this machine.
var ErrNotLoopback = errors.New("only loopback targets (127.0.0.0/8, ::1, localhost) are allowed")

// CheckHost accepts localhost and loopback IP literals only; it resolves
// nothing.
func CheckHost(host string) error {
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q: %w", host, ErrNotLoopback)
}

// CheckURL parses raw, an http URL on a loopback host.
func CheckURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("%q: want an http:// URL", raw)
	}
	if err := CheckHost(u.Hostname()); err != nil {
		return nil, err
	}
	return u, nil
}

// LoopbackDialer dials loopback addresses only: a second guard behind
// CheckURL and CheckHost, applied to the address actually dialled.
func LoopbackDialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout: timeout,
		Control: func(network, address string, _ syscall.RawConn) error {
			if strings.HasPrefix(network, "unix") {
				return nil // a local socket file
			}
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
				return fmt.Errorf("dial %s: %w", address, ErrNotLoopback)
			}
			return nil
		},
	}
}

// DialLoopback is LoopbackDialer's DialContext, in the shape pgx and
// net/http take.
func DialLoopback(ctx context.Context, network, addr string) (net.Conn, error) {
	return LoopbackDialer(5*time.Second).DialContext(ctx, network, addr)
}
