// Package failover holds the failover test: etcd and two Patroni-managed
// PostgreSQL nodes (a leader and a synchronous standby) on loopback ports,
// the example server on a multi-host DSN under load, and a kill -9 of the
// leader. It needs the Debian packages patroni, etcd-server and postgresql
// and about a minute, so it sits behind the failover build tag:
//
//	make test/failover
//
// A Go test rather than a shell script: it starts every process itself and
// stops each by its pid in t.Cleanup, even when an assertion fails, drives
// the load and checks the answers and the database in one place.
package failover
