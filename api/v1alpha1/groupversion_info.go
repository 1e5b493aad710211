// Package v1alpha1 holds the erasure.lethe.dev/v1alpha1 API: ErasureRequest
// and MemoryStore. Validation lives here as OpenAPI markers and CEL rules, so
// the API server refuses bad input at admission without a webhook.
//
// +kubebuilder:object:generate=true
// +groupName=erasure.lethe.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of the Lethe API.
	GroupVersion = schema.GroupVersion{Group: "erasure.lethe.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the Lethe kinds with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the Lethe kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&ErasureRequest{}, &ErasureRequestList{},
		&MemoryStore{}, &MemoryStoreList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
