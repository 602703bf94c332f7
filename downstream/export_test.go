package downstream

// TestKeyring is testKeyring, for the package's external tests.
var TestKeyring = testKeyring
