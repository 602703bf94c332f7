package sqlstore

import (
	"errors"
	"net/url"
	"strings"
)

// MySQLDSN converts a mysql://user:pass@host:port/db?params URL (the form
// DATABASE_URL and IDEMPOTENCY_TEST_MYSQL_URL take) into the DSN
// go-sql-driver/mysql reads, user:pass@tcp(host:port)/db?params, with
// parseTime=true added. The port defaults to 3306. A string that is not a
// mysql:// URL is returned unchanged, taken to be a driver DSN already.
// Name a dial timeout (timeout=5s): without one, a connect to a host that
// vanished waits for the operating system's TCP timeout.
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
