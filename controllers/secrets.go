package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
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
