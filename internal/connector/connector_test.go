package connector

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// What stands in the way is told apart: a configuration a human must fix
// (a *erasure.ConfigError with its reason) or an outage (a plain error).
func TestConnectorTellsConfigurationFromOutage(t *testing.T) {
	secret := func(data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pg"}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	failingGet := func(err error) interceptor.Funcs {
		return interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return err
		}}
	}
	gr := schema.GroupResource{Resource: "secrets"}
	cases := map[string]struct {
		reason  string
		objects []client.Object
		funcs   interceptor.Funcs
		// wantReason is the ConfigError's reason; empty: a plain error.
		wantReason string
	}{
		"missing secret": {reason: "a Secret that does not exist is for a human to create",
			wantReason: lethev1.ReasonSecretNotFound},
		"missing key": {reason: "a Secret without the key is for a human to fix",
			objects: []client.Object{secret(map[string]string{"other": "x"})}, wantReason: lethev1.ReasonSecretKeyMissing},
		"forbidden": {reason: "RBAC refusing the read is configuration",
			funcs: failingGet(apierrors.NewForbidden(gr, "pg", errors.New("no"))), wantReason: lethev1.ReasonSecretNotFound},
		"api server down": {reason: "an API server failing is an outage: an error, retried with backoff",
			funcs: failingGet(apierrors.NewServiceUnavailable("down"))},
		"unparsable dsn": {reason: "a DSN pgx cannot parse is configuration, and its text never echoes the DSN",
			objects: []client.Object{secret(map[string]string{"dsn": "postgres://u:secret@[::1"})}, wantReason: lethev1.ReasonInvalidSecret},
	}
	store := &lethev1.MemoryStore{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
		Spec: lethev1.MemoryStoreSpec{Postgres: lethev1.PostgresSpec{DSNSecretRef: lethev1.SecretKeyRef{Name: "pg", Key: "dsn"}}}}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := &Connector{Pools: &postgres.Pools{}, Graphs: &graph.Clients{},
				Secrets: fake.NewClientBuilder().WithObjects(tc.objects...).WithInterceptorFuncs(tc.funcs).Build()}
			defer c.Pools.Close()
			_, err := c.Ports(context.Background(), store)
			if err == nil {
				t.Fatalf("%s: no error", tc.reason)
			}
			var ce *erasure.ConfigError
			isConfig := errors.As(err, &ce)
			switch {
			case tc.wantReason == "" && isConfig:
				t.Errorf("%s: got a ConfigError %q, want a plain error", tc.reason, ce.Message)
			case tc.wantReason != "" && !isConfig:
				t.Errorf("%s: got %v, want a ConfigError %s", tc.reason, err, tc.wantReason)
			case isConfig && ce.Reason != tc.wantReason:
				t.Errorf("%s: reason %s, want %s", tc.reason, ce.Reason, tc.wantReason)
			}
			if isConfig && strings.Contains(ce.Message, "secret@") {
				t.Errorf("%s: the message %q echoes the DSN", tc.reason, ce.Message)
			}
		})
	}
}

// A store that configures Velero is never given a nil backups port (its
// backup step would complete as NotConfigured).
func TestConnectorRefusesVeleroStoreWithoutVeleroPort(t *testing.T) {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pg"},
		Data: map[string][]byte{"dsn": []byte("postgres://u@127.0.0.1:1/db?connect_timeout=1")}}
	c := &Connector{Pools: &postgres.Pools{}, Graphs: &graph.Clients{}, Secrets: fake.NewClientBuilder().WithObjects(s).Build()}
	defer c.Pools.Close()
	store := &lethev1.MemoryStore{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
		Spec: lethev1.MemoryStoreSpec{Postgres: lethev1.PostgresSpec{DSNSecretRef: lethev1.SecretKeyRef{Name: "pg", Key: "dsn"}},
			Velero: &lethev1.VeleroSpec{}}}
	if _, err := c.Ports(context.Background(), store); err == nil || !strings.Contains(err.Error(), "Velero") {
		t.Fatalf("a Velero store without a Velero port: %v, want an error naming Velero", err)
	}
}
