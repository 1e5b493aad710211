package connector

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// A Secret value is read once per SecretTTL; a rotated value is seen once
// the TTL is over; a failed read is never held.
func TestReadSecretKeyHoldsAValueForTheTTL(t *testing.T) {
	ctx := context.Background()
	gets := 0
	cl := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			gets++
			return c.Get(ctx, key, obj, opts...)
		}}).Build()
	clk := clocktesting.NewFakePassiveClock(time.Now())
	c := &Connector{Secrets: cl, SecretTTL: 5 * time.Second, Clock: clk}
	ref := lethev1.SecretKeyRef{Name: "pg", Key: "dsn"}
	read := func() (string, error) { return c.ReadSecretKey(ctx, "ns", ref) }

	// Missing: a ConfigError each time, each a fresh read.
	for range 2 {
		var ce *erasure.ConfigError
		if _, err := read(); !errors.As(err, &ce) {
			t.Fatalf("a missing Secret: got %v, want a ConfigError", err)
		}
	}
	if gets != 2 {
		t.Fatalf("a missing Secret was held: %d reads for 2 passes, want 2", gets)
	}
	// Created by a human: seen on the very next pass.
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pg"}, Data: map[string][]byte{"dsn": []byte("old")}}
	if err := cl.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if v, err := read(); err != nil || v != "old" {
		t.Fatalf("the Secret once created: got %q, %v", v, err)
	}
	// Rotated: the held value until the TTL is over, then the new one.
	s.Data["dsn"] = []byte("new")
	if err := cl.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	before := gets
	clk.SetTime(clk.Now().Add(4 * time.Second))
	if v, _ := read(); v != "old" || gets != before {
		t.Fatalf("within the TTL: got %q after %d more reads, want the held value and none", v, gets-before)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	if v, _ := read(); v != "new" || gets != before+1 {
		t.Fatalf("at the TTL: got %q after %d more reads, want the rotated value and one read", v, gets-before)
	}
	// Another key of the same Secret is its own entry.
	if _, err := c.ReadSecretKey(ctx, "ns", lethev1.SecretKeyRef{Name: "pg", Key: "other"}); err == nil {
		t.Fatal("a key the Secret does not have was answered from another key's value")
	}
	// Zero TTL: every pass reads.
	c0 := &Connector{Secrets: cl, Clock: clk}
	before = gets
	for range 3 {
		if _, err := c0.ReadSecretKey(ctx, "ns", ref); err != nil {
			t.Fatal(err)
		}
	}
	if gets-before != 3 {
		t.Fatalf("SecretTTL 0: %d reads for 3 passes, want 3", gets-before)
	}
}
