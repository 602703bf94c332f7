package sqlstore_test

import "sync"

var dbsMu sync.Mutex
