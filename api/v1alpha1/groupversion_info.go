// Package v1alpha1 holds the erasure.lethe.dev/v1alpha1 API: ErasureRequest
// and MemoryStore. Validation lives here as OpenAPI markers and CEL rules, so
// the API server refuses bad input at admission without a webhook.
//
// +kubebuilder:object:generate=true
// +groupName=erasure.lethe.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the Lethe API.
	GroupVersion = schema.GroupVersion{Group: "erasure.lethe.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the Lethe kinds with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the Lethe kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
