package postgres

// VacuumsWaiting is how many callers of the Erasers sharing e's memo wait
// for a vacuum not yet started (tests synchronise on it).
func (e *Eraser) VacuumsWaiting() int {
	q := &e.memo().vacuums
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, r := range q.pending {
		n += r.waiters
	}
	return n
}

// NotErasedSQL is Verify's ledger check, for its plan test.
const NotErasedSQL = notErasedSQL

// NearCopiesSQL is the residue probe's statement for one column, for its
// plan test.
func NearCopiesSQL(schema, table, column string) string {
	return nearCopiesSQL(QColumn{Table: Table{Schema: schema, Name: table}, Column: column}, "")
}

// KeepContentKeys is keepContentKeys, for its unit test.
var KeepContentKeys = keepContentKeys

// ContentCheckSQL is Verify's content check of the content index
// schema.table keyed by column, with its tenant column (if any) listing
// tenants (text[]) or holding one per row.
func ContentCheckSQL(schema, table, column, tenantColumn string, tenantList bool) string {
	return leftContentSQL(ContentIndex{QColumn: QColumn{Table: Table{Schema: schema, Name: table}, Column: column},
		TenantColumn: tenantColumn, TenantList: tenantList})
}

// ContentNearCopiesSQL is the residue probe's statement for the vector
// column of a content index whose tenants are in tenantColumn (a text[]),
// with the condition that skips entries an erasure still shares.
func ContentNearCopiesSQL(schema, table, key, vector, tenantColumn string) string {
	idx := ContentIndex{QColumn: QColumn{Table: Table{Schema: schema, Name: table}, Column: key}, TenantColumn: tenantColumn, TenantList: true}
	return nearCopiesSQL(QColumn{Table: idx.Table, Column: vector}, probedContentRows(Layout{ContentIndexes: []ContentIndex{idx}})[idx.Table])
}

// ParameterLoggingSQL is the audit's statement reading the settings that
// log statement parameters.
const ParameterLoggingSQL = parameterLoggingSQL

// UnderOtherKeysSQL is the audit's count of requests under another erasure
// key, for its plan test.
const UnderOtherKeysSQL = underOtherKeysSQL

// ErasedRequestsSQL is the audit's list of the requests the ledger holds
// erasures of, for its plan test.
const ErasedRequestsSQL = erasedRequestsSQL
