package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/graph"
)

// readSecretKey reads one key of a Secret in namespace straight from the API
// server (reader is the manager's API reader: no Secret cache). The value is
// never logged or put in a message.
func readSecretKey(ctx context.Context, reader client.Reader, namespace string, ref lethev1.SecretKeyRef) (string, *failure) {
	secret := &corev1.Secret{}
	err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, secret)
	if apierrors.IsNotFound(err) {
		return "", fail(lethev1.ReasonSecretNotFound, "Secret %s/%s not found", namespace, ref.Name)
	}
	if err != nil {
		return "", fail(lethev1.ReasonSecretNotFound, "cannot read Secret %s/%s: %v", namespace, ref.Name, err)
	}
	v, ok := secret.Data[ref.Key]
	if !ok || len(v) == 0 {
		return "", fail(lethev1.ReasonSecretKeyMissing, "Secret %s/%s has no key %q", namespace, ref.Name, ref.Key)
	}
	return string(v), nil
}

// storeGraph returns a store's graph, reading the URL from its Secret.
func storeGraph(ctx context.Context, reader client.Reader, clients *graph.Clients, store *lethev1.MemoryStore) (*graph.Graph, *failure) {
	url, f := readSecretKey(ctx, reader, store.Namespace, store.Spec.FalkorDB.URLSecretRef)
	if f != nil {
		return nil, f
	}
	cl, err := clients.Get(poolKey(store, "graph"), url)
	if err != nil {
		return nil, fail(lethev1.ReasonInvalidSecret, "%v", err)
	}
	name := store.Spec.FalkorDB.Graph
	if name == "" {
		name = "memory"
	}
	return cl.Graph(name), nil
}
