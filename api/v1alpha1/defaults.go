package v1alpha1

import "time"

// The defaults of the CRDs' optional fields. The API server applies them
// from the +kubebuilder:default markers; the code reads a field through the
// methods below, so an object admitted before a default existed (or built
// in a test) behaves the same. defaults_test.go checks the markers agree.
const (
	DefaultSchema          = "memory"
	DefaultGraph           = "memory"
	DefaultSweepInterval   = 168 * time.Hour
	DefaultVeleroNamespace = "velero"
	DefaultRotationWindow  = 720 * time.Hour
	DefaultGracePeriod     = 168 * time.Hour
	// DefaultMinGracePeriod is the shortest grace period a request that is
	// not immediate may ask for (the manager's --min-grace-period).
	DefaultMinGracePeriod = time.Hour
)

// SchemaOrDefault is the schema of the memory tables.
func (p PostgresSpec) SchemaOrDefault() string {
	if p.Schema == "" {
		return DefaultSchema
	}
	return p.Schema
}

// GraphOrDefault is the graph's name.
func (f *FalkorDBSpec) GraphOrDefault() string {
	if f == nil || f.Graph == "" {
		return DefaultGraph
	}
	return f.Graph
}

// SweepIntervalOrDefault is how often the graph is swept.
func (f *FalkorDBSpec) SweepIntervalOrDefault() time.Duration {
	if f == nil || f.SweepInterval == nil || f.SweepInterval.Duration <= 0 {
		return DefaultSweepInterval
	}
	return f.SweepInterval.Duration
}

// NamespaceOrDefault is where the store's Velero Backups are.
func (v *VeleroSpec) NamespaceOrDefault() string {
	if v == nil || v.Namespace == "" {
		return DefaultVeleroNamespace
	}
	return v.Namespace
}

// RotationWindowOrDefault is the longest a Backup holding erased data may
// live after the deletion.
func (v *VeleroSpec) RotationWindowOrDefault() time.Duration {
	if v == nil || v.RotationWindow == nil {
		return DefaultRotationWindow
	}
	return v.RotationWindow.Duration
}

// MinRetentionOrZero is the store's retention floor for Backups (0: none).
func (v *VeleroSpec) MinRetentionOrZero() time.Duration {
	if v == nil || v.MinRetention == nil {
		return 0
	}
	return v.MinRetention.Duration
}

// DefaultClockSkew is the margin a Backup's start is compared with the
// deletion's commit by, when the store sets none.
const DefaultClockSkew = 5 * time.Minute

// ClockSkewOrDefault is the store's clock skew margin for Backup starts.
func (v *VeleroSpec) ClockSkewOrDefault() time.Duration {
	if v == nil || v.ClockSkew == nil {
		return DefaultClockSkew
	}
	return v.ClockSkew.Duration
}

// VacuumOrDefault is how a deletion's tables are vacuumed (Lazy when unset).
func (p PostgresSpec) VacuumOrDefault() VacuumMode {
	if p.Vacuum == "" {
		return VacuumLazy
	}
	return p.Vacuum
}
