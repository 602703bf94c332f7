// Command exampledoc writes the example server's OpenAPI document to
// standard output: run `go run ./cmd/exampledoc > ../../examples/server/openapi.json`
// in contrib/openapi after changing the example's routes or this module.
package main

import (
	"fmt"
	"os"

	"github.com/idemkit/idempotency/contrib/openapi/internal/exampledoc"
)

func main() {
	b, err := exampledoc.JSON()
	if err == nil {
		_, err = exampledoc.Document() // refuse to write a document that does not validate
	}
	if err == nil {
		_, err = os.Stdout.Write(b)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "exampledoc:", err)
		os.Exit(1)
	}
}
