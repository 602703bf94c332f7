// Package matrix is the fault matrix (DESIGN.md, "Every path, every fault"):
// one harness that runs every listed fault against every cell (entry point x
// store x ordinary/transactional x fail-closed/fail-open x plain/sealed) it
// applies to, and prints the matrix with N/A and its reason where a fault
// does not apply. It is a nested module that is never released; its tests
// carry the build tag matrix, so only make test/matrix runs them:
//
//	cd internal/matrix && go test -tags matrix -count=1 -run TestMatrix .
//
// MATRIX_PARALLEL (default 4) bounds the cells run at once; MATRIX_RUN, a
// regular expression, selects cells by name (entry/store/mode/policy/seal/fault).
package matrix
