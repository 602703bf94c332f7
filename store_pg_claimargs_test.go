package idempotency

import (
	"regexp"
	"strconv"
	"testing"
)

// TestClaimArgsFitTheSQL: claimArgs gives pgClaimSQL exactly the parameters
// it numbers, as the raw-SQL benchmarks rely on (they send claimArgs too).
func TestClaimArgsFitTheSQL(t *testing.T) {
	top := 0
	for _, m := range regexp.MustCompile(`\$(\d+)`).FindAllStringSubmatch(pgClaimSQL, -1) {
		n, _ := strconv.Atoi(m[1])
		top = max(top, n)
	}
	if got := len(claimArgs(ClaimRequest{})); got != top {
		t.Errorf("claimArgs gives %d parameters, pgClaimSQL numbers %d", got, top)
	}
}
