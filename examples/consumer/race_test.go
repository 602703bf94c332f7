//go:build race

package main

// raceEnabled: the tests run with the race detector, so the consumer
// processes they start are built with it too.
const raceEnabled = true
