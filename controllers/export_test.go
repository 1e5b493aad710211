package controllers

// SetFaultHook installs a crash simulator for the integration tests; it is
// compiled only into test binaries. It returns a function that removes it.
func SetFaultHook(h func(namespace, point string) bool) (restore func()) {
	faultHook.Store(&h)
	return func() { faultHook.Store(nil) }
}
