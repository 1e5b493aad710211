package v1alpha1

// SessionIDPattern is the one spelling of a session ID the API admits: a
// UUID in canonical lowercase form (RE2 syntax, for Go's regexp and CEL's
// matches alike). The XValidation marker on SessionID cannot refer to a Go
// constant, so it spells the pattern out; a test keeps the marker and the
// generated CRDs equal to this constant. Every other check of a session ID
// (the CLI, the graph adapter) compiles this constant.
const SessionIDPattern = `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
