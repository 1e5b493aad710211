package erasurecli

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func durationPtr(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
func timePtr(t time.Time) *metav1.Time             { return &metav1.Time{Time: t} }
