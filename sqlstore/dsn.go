package sqlstore

import (
	"database/sql"
	"errors"
	"net/url"
	"reflect"
	"strings"
	"time"
)

// MySQLDSN converts a mysql://user:pass@host:port/db?params URL (the form
// DATABASE_URL and IDEMPOTENCY_TEST_MYSQL_URL take) into the DSN
// go-sql-driver/mysql reads, user:pass@tcp(host:port)/db?params, with
// parseTime=true added. The port defaults to 3306. A string that is not a
// mysql:// URL is returned unchanged, taken to be a driver DSN already.
// Name a dial timeout (timeout=5s): without one, a connect to a host that
// vanished waits for the operating system's TCP timeout, and New warns.
func MySQLDSN(rawURL string) (string, error) {
	if !strings.HasPrefix(rawURL, "mysql://") {
		return rawURL, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", errors.New("sqlstore: MySQLDSN: not a valid mysql:// URL") // the text would hold the password
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1"
	}
	if u.Port() == "" {
		host += ":3306"
	}
	var b strings.Builder
	if u.User != nil {
		b.WriteString(u.User.Username())
		if p, ok := u.User.Password(); ok {
			b.WriteString(":" + p)
		}
		b.WriteString("@")
	}
	b.WriteString("tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/"))
	q := u.Query()
	if q.Get("parseTime") == "" {
		q.Set("parseTime", "true")
	}
	b.WriteString("?" + q.Encode())
	return b.String(), nil
}

// dialTimeout reports whether db's MySQL connections are opened with a
// dial timeout, and whether it could tell. database/sql does not expose a
// pool's connector and this package does not import the driver, so it
// reads, by reflection, the two forms go-sql-driver/mysql pools take:
// sql.Open's DSN (a timeout= parameter) and mysql.NewConnector's *Config
// (its Timeout). Any other pool is not known.
func dialTimeout(db *sql.DB) (set, known bool) {
	c := reflect.ValueOf(db).Elem().FieldByName("connector")
	if !c.IsValid() || c.Kind() != reflect.Interface || c.IsNil() {
		return false, false
	}
	c = c.Elem()
	if c.Kind() == reflect.Pointer && !c.IsNil() {
		c = c.Elem()
	}
	if c.Kind() != reflect.Struct {
		return false, false
	}
	if dsn := c.FieldByName("dsn"); dsn.IsValid() && dsn.Kind() == reflect.String { // sql.Open
		_, query, _ := strings.Cut(dsn.String(), "?")
		q, err := url.ParseQuery(query)
		if err != nil {
			return false, false
		}
		d, err := time.ParseDuration(q.Get("timeout"))
		return err == nil && d > 0, true
	}
	cfg := c.FieldByName("cfg") // mysql.NewConnector
	if !cfg.IsValid() || cfg.Kind() != reflect.Pointer || cfg.IsNil() || cfg.Elem().Type().Name() != "Config" {
		return false, false
	}
	t := cfg.Elem().FieldByName("Timeout")
	if !t.IsValid() || t.Kind() != reflect.Int64 {
		return false, false
	}
	return t.Int() > 0, true
}
