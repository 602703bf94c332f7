// Package pgbscript turns the store's SQL statements into pgbench script
// lines: bench/cmd/pgbenchsql and bench/cmd/ablation write their scripts
// from the statements in the library's source files with it.
package pgbscript

import (
	"regexp"
	"strconv"
	"strings"
)

var param = regexp.MustCompile(`\$([0-9]+)`)

// Bind replaces $1..$n in sql with args[0]..args[n-1]; a placeholder past
// the end of args stays as it is.
func Bind(sql string, args []string) string {
	return param.ReplaceAllStringFunc(sql, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		if n < 1 || n > len(args) {
			return m
		}
		return args[n-1]
	})
}

// OneLine joins the statement's lines: pgbench reads a statement up to its
// semicolon, and a meta-command (\gset) must follow on the next line.
func OneLine(sql string) string {
	return strings.Join(strings.Fields(sql), " ")
}
