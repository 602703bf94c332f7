package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/downstream"
)

// Environment variables read by the server. The flags have the same names
// in lower case with dashes; a flag given on the command line wins.
const (
	envAddr             = "ADDR"
	envDatabaseURL      = "DATABASE_URL"
	envMigrateURL       = "MIGRATE_DATABASE_URL"
	envOrderLatency     = "ORDER_LATENCY"
	envLease            = "IDEMPOTENCY_LEASE"
	envStoreTimeout     = "IDEMPOTENCY_STORE_TIMEOUT"
	envSessionSecret    = "SESSION_SECRET"
	envNewOrdersDisable = "MBT_NEW_ORDERS_DISABLED"
	// envSealKeys holds the keys that seal stored responses (README
	// "Sealing stored responses"); never a flag, which ps would show.
	envSealKeys = "IDEMPOTENCY_SEAL_KEYS"
	// envVenueURL switches the order route to live mode (docs/live-trading.md).
	envVenueURL = "VENUE_URL"
	// The venue's credentials, sent as APCA-API-KEY-ID and
	// APCA-API-SECRET-KEY; never flags.
	envVenueKeyID  = "VENUE_KEY_ID"
	envVenueSecret = "VENUE_SECRET_KEY"
	// envDeriveKeys holds the keys the live mode derives client_order_ids
	// under; never a flag.
	envDeriveKeys = "IDEMPOTENCY_DERIVE_KEYS"
	// envKillSwitch is idempotency.FlagEnv, read per request.
)

// devSessionSecret signs session tokens when SESSION_SECRET is unset. It is
// public, so anyone can mint a token: the server warns at start-up.
const devSessionSecret = "idemkit-example-development-secret-do-not-use-in-production"

// dbStartupWait is how long start-up retries an unreachable database.
const dbStartupWait = 30 * time.Second

// maxOrdersTTL is the order route's TTL; its lease may be at most half of it.
const maxOrdersTTL = 24 * time.Hour

// config is the server's configuration, from flags and environment.
type config struct {
	addr         string
	databaseURL  string
	migrateURL   string // migrations' direct URL when databaseURL goes through a transaction pooler; empty: databaseURL
	orderLatency time.Duration
	lease        time.Duration
	storeTimeout time.Duration
	sealKeysFile string               // -seal-keys-file: the seal keys' file, read instead of IDEMPOTENCY_SEAL_KEYS
	sealKeys     idempotency.SealKeys // nil: responses are stored in plaintext
	// The live mode (venueURL set): orders go to that venue.
	venueURL    string
	venueKeyID  string
	venueSecret string
	deriveKeys  *downstream.Keyring // IDEMPOTENCY_DERIVE_KEYS; nil in live mode: generated at start, with a warning

	// getenv is read per request for the kill-switch
	// (FLAG_IDEMPOTENCY_MIDDLEWARE) and the new-orders gate
	// (MBT_NEW_ORDERS_DISABLED), so tests can flip them.
	getenv        func(string) string
	sessionSecret []byte
	devSecret     bool // SESSION_SECRET was unset: warn at start-up
	logger        *slog.Logger

	// Not reachable from the command line: tests shorten or inject these.
	dbWait     time.Duration                      // start-up retry of the database
	pool       *pgxpool.Pool                      // an existing pool to use instead of databaseURL; never closed by the server
	beforeFill func(ctx context.Context, o order) // called before the simulated fill
}

// usageError is a bad command line or environment: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// durationFlag is a flag.Value for durations in Go syntax whose parse errors
// say what was wrong, unlike flag.Duration's "parse error".
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return errors.New("want a Go duration such as 300ms, 2s or 1m30s")
	}
	*f.d = d
	return nil
}

// newFlagSet declares the flags into cfg, with the built-in defaults.
func newFlagSet(cfg *config) *flag.FlagSet {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, usage printed by run
	cfg.addr = "127.0.0.1:8080"
	cfg.lease = 30 * time.Second
	cfg.storeTimeout = 2 * time.Second
	fs.StringVar(&cfg.addr, "addr", cfg.addr, "listen address, host:port (env "+envAddr+")")
	fs.StringVar(&cfg.databaseURL, "database-url", "", "PostgreSQL URL; empty runs everything in memory (env "+envDatabaseURL+")")
	fs.StringVar(&cfg.migrateURL, "migrate-database-url", "", "PostgreSQL URL the start-up migrations use, direct (never through a transaction pooler such as PgBouncer); empty uses -database-url (env "+envMigrateURL+")")
	fs.Var(durationFlag{&cfg.orderLatency}, "order-latency", "simulated fill latency, e.g. 300ms; in live mode, waited before the venue call (env "+envOrderLatency+")")
	fs.StringVar(&cfg.venueURL, "venue-url", "", "live mode: send orders to the venue at this URL, e.g. http://127.0.0.1:8090; empty fills them on paper (env "+envVenueURL+")")
	fs.Var(durationFlag{&cfg.lease}, "lease", "how long a claimed idempotency key is owned; also the shutdown drain limit (env "+envLease+")")
	fs.StringVar(&cfg.sealKeysFile, "seal-keys-file", "", "seal stored responses with the keys in this `PATH` (the format of "+envSealKeys+", read when this is not given)")
	fs.Var(durationFlag{&cfg.storeTimeout}, "store-timeout", "deadline of every idempotency store call, and of the example's own database calls (env "+envStoreTimeout+")")
	return fs
}

// printUsage writes the -h text.
func printUsage(w io.Writer) {
	var cfg config
	fs := newFlagSet(&cfg)
	fs.SetOutput(w)
	fmt.Fprintf(w, `Usage: server [flags]

The idempotency example: a paper-trading API. Without a database URL it keeps
everything in memory; with one it migrates and uses PostgreSQL.

Flags (each also an environment variable; the flag wins):
`)
	fs.PrintDefaults()
	fmt.Fprintf(w, `
Other environment variables:
  FLAG_IDEMPOTENCY_MIDDLEWARE  0, false, off or no turns the middleware into a pass-through
  SESSION_SECRET               HMAC key of the session tokens (a public development key when unset)
  MBT_NEW_ORDERS_DISABLED      1 refuses new orders with 503 new_orders_disabled
  IDEMPOTENCY_SEAL_KEYS        seal stored responses: ID:KEY entries, comma-separated, KEY the
                               standard base64 of 32 random bytes, the first the active key
  VENUE_KEY_ID                 live mode: sent to the venue as APCA-API-KEY-ID
  VENUE_SECRET_KEY             live mode: sent to the venue as APCA-API-SECRET-KEY
  IDEMPOTENCY_DERIVE_KEYS      live mode: the keys client_order_ids are derived under, in the
                               format of IDEMPOTENCY_SEAL_KEYS (generated at start when unset: set
                               it, or a restart sends new ids)
`)
}

// parseConfig reads the flags, then the environment for every flag not
// given. Errors are *usageError, or flag.ErrHelp for -h.
func parseConfig(args []string, getenv func(string) string) (config, error) {
	var cfg config
	fs := newFlagSet(&cfg)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, &usageError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return cfg, usagef("unexpected argument %q: the server takes flags only", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	fromEnv := func(name, env string) (string, bool) {
		if given[name] {
			return "", false
		}
		v := strings.TrimSpace(getenv(env))
		return v, v != ""
	}
	if v, ok := fromEnv("addr", envAddr); ok {
		cfg.addr = v
	}
	if v, ok := fromEnv("database-url", envDatabaseURL); ok {
		cfg.databaseURL = v
	}
	if v, ok := fromEnv("migrate-database-url", envMigrateURL); ok {
		cfg.migrateURL = v
	}
	if v, ok := fromEnv("venue-url", envVenueURL); ok {
		cfg.venueURL = v
	}
	for _, d := range []struct {
		name, env string
		dst       *time.Duration
	}{
		{"order-latency", envOrderLatency, &cfg.orderLatency},
		{"lease", envLease, &cfg.lease},
		{"store-timeout", envStoreTimeout, &cfg.storeTimeout},
	} {
		if v, ok := fromEnv(d.name, d.env); ok {
			if err := (durationFlag{d.dst}).Set(v); err != nil {
				return cfg, usagef("invalid value %q for %s: %v", v, d.env, err)
			}
		}
	}

	switch {
	case cfg.orderLatency < 0:
		return cfg, usagef("-order-latency (%s) must not be negative, got %v", envOrderLatency, cfg.orderLatency)
	case cfg.lease <= 0:
		return cfg, usagef("-lease (%s) must be positive, got %v", envLease, cfg.lease)
	case cfg.storeTimeout <= 0:
		return cfg, usagef("-store-timeout (%s) must be positive, got %v", envStoreTimeout, cfg.storeTimeout)
	case cfg.lease <= cfg.storeTimeout:
		return cfg, usagef("-lease (%s) must exceed -store-timeout (%s): got lease %v, store timeout %v",
			envLease, envStoreTimeout, cfg.lease, cfg.storeTimeout)
	case 2*cfg.lease > maxOrdersTTL:
		return cfg, usagef("-lease (%s) must be at most %v (half the order route's 24h TTL), got %v",
			envLease, maxOrdersTTL/2, cfg.lease)
	}
	if _, _, err := net.SplitHostPort(cfg.addr); err != nil {
		return cfg, usagef("invalid -addr (%s) %q: want host:port, e.g. 127.0.0.1:8080", envAddr, cfg.addr)
	}
	if isMySQLURL(cfg.databaseURL) {
		if _, err := mysqlConfig(cfg.databaseURL); err != nil {
			return cfg, usagef("invalid -database-url (%s): %v", envDatabaseURL, err)
		}
		if cfg.migrateURL != "" {
			return cfg, usagef("-migrate-database-url (%s) is for PostgreSQL behind a pooler; a MySQL database migrates over its own connection", envMigrateURL)
		}
	} else if cfg.databaseURL != "" {
		if _, err := pgxpool.ParseConfig(cfg.databaseURL); err != nil {
			return cfg, usagef("invalid -database-url (%s): %v", envDatabaseURL, err)
		}
	}
	if cfg.migrateURL != "" {
		if cfg.databaseURL == "" {
			return cfg, usagef("-migrate-database-url (%s) needs -database-url (%s)", envMigrateURL, envDatabaseURL)
		}
		if _, err := pgxpool.ParseConfig(cfg.migrateURL); err != nil {
			return cfg, usagef("invalid -migrate-database-url (%s): %v", envMigrateURL, err)
		}
	}

	if err := cfg.readSealKeys(getenv); err != nil {
		return cfg, err
	}
	if err := cfg.readVenue(getenv); err != nil {
		return cfg, err
	}
	cfg.getenv = getenv
	if s := getenv(envSessionSecret); s != "" {
		cfg.sessionSecret = []byte(s)
	} else {
		cfg.sessionSecret = []byte(devSessionSecret)
		cfg.devSecret = true
	}
	cfg.dbWait = dbStartupWait
	return cfg, nil
}

// readSealKeys reads the seal keys from -seal-keys-file, else from
// IDEMPOTENCY_SEAL_KEYS. Malformed keys stop the server: the error names
// the entry by position and ID, never its text.
func (cfg *config) readSealKeys(getenv func(string) string) error {
	text, from := getenv(envSealKeys), envSealKeys
	if cfg.sealKeysFile != "" {
		b, err := os.ReadFile(cfg.sealKeysFile)
		if err != nil {
			return usagef("-seal-keys-file: %v", err)
		}
		text, from = string(b), "-seal-keys-file "+cfg.sealKeysFile
	} else if text == "" {
		return nil
	}
	keys, err := idempotency.ParseSealKeys(text)
	if err != nil {
		return usagef("%s: %v", from, err)
	}
	cfg.sealKeys = keys
	return nil
}

// readVenue checks -venue-url and reads the live mode's secrets, which
// only the environment carries.
func (cfg *config) readVenue(getenv func(string) string) error {
	if cfg.venueURL == "" {
		return nil
	}
	u, err := url.Parse(cfg.venueURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("invalid -venue-url (%s) %q: want an http or https URL, e.g. http://127.0.0.1:8090", envVenueURL, cfg.venueURL)
	}
	cfg.venueKeyID, cfg.venueSecret = getenv(envVenueKeyID), getenv(envVenueSecret)
	if text := strings.TrimSpace(getenv(envDeriveKeys)); text != "" {
		keys, err := downstream.ParseKeys(text)
		if err != nil {
			return usagef("%s: %v", envDeriveKeys, err)
		}
		cfg.deriveKeys = keys
	}
	return nil
}

// truthy reports whether an on/off environment value is on: 1, true, yes or
// on, in any case.
// falsy reports the kill-switch's off values, as idempotency.EnabledFromEnv
// reads them: "0", "false", "off" or "no", any case.
func falsy(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "0", "false", "off", "no":
		return true
	}
	return false
}

func truthy(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}
