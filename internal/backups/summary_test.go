package backups_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/lethe-dev/lethe/internal/backups"
)

// fixture is one Backup that started before every deletion, and a Rotator.
type fixture struct {
	c  client.Client
	r  backups.Rotator
	sc backups.Scope
}

func newFixture(t *testing.T, b *velerov1.Backup) fixture {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := velerov1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(b).Build()
	return fixture{c: c, r: backups.Rotator{Client: c, Reader: c}, sc: backups.Scope{Namespace: "velero", Selector: labels.Everything()}}
}

func (f fixture) backup(t *testing.T) *velerov1.Backup {
	t.Helper()
	b := &velerov1.Backup{}
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "velero", Name: "nightly"}, b); err != nil {
		t.Fatal(err)
	}
	return b
}

var started = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

func nightly(ann map[string]string, exp time.Time) *velerov1.Backup {
	return &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "velero", Annotations: ann},
		Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseCompleted, StartTimestamp: &metav1.Time{Time: started}, Expiration: &metav1.Time{Time: exp}}}
}

// Many requests rotating one Backup leave one annotation of bounded size
// that counts each once, with the earliest deadline and a digest of their
// UIDs an auditor recomputes; a request rotating it again counts once.
func TestSummaryStaysBounded(t *testing.T) {
	const requests = 5000
	f := newFixture(t, nightly(nil, started.Add(365*24*time.Hour)))
	var uids []string
	for i := range requests {
		uid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		uids = append(uids, uid)
		// Deadlines go up and down; the earliest is request 1234's.
		deleted := started.Add(time.Duration(24+(i*7919)%1000) * time.Hour)
		if i == 1234 {
			deleted = started.Add(time.Hour)
		}
		req := backups.Request{UID: uid, Namespace: "team", Name: fmt.Sprintf("forget-person-%d", i), DeletedAt: deleted, Window: time.Hour}
		for range 1 + i%2 { // every other request twice: a retry
			if _, err := f.r.Rotate(context.Background(), f.sc, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	b := f.backup(t)
	if len(b.Annotations) != 2 {
		t.Fatalf("%d annotations, want the summary and the original expiration: %v", len(b.Annotations), b.Annotations)
	}
	size := len(b.Annotations[backups.AnnotationErasures])
	if size > 2048 {
		t.Fatalf("summary of %d bytes after %d requests, want at most 2 KiB", size, requests)
	}
	s := backups.ReadSummary(b.Annotations)
	want := started.Add(2 * time.Hour).Format(time.RFC3339)
	if s.Count != requests || s.EarliestDeadline != want || s.RequestsDigest != backups.RequestsDigest(uids) {
		t.Fatalf("summary count %d (want %d), earliest %s (want %s), digest matches %v", s.Count, requests, s.EarliestDeadline, want,
			s.RequestsDigest == backups.RequestsDigest(uids))
	}
	if strings.Contains(fmt.Sprint(b.Annotations), "forget") {
		t.Fatalf("a request name left the request's namespace: %v", b.Annotations)
	}
	if !b.Status.Expiration.Time.Equal(started.Add(2 * time.Hour)) {
		t.Fatalf("expiration %s, want the earliest deadline", b.Status.Expiration)
	}
	t.Logf("%d requests: one summary of %d bytes", requests, size)
}

// A Backup marked by an earlier release (one annotation per request) is
// folded into the summary on its next rotation.
func TestSummaryFoldsPerRequestAnnotations(t *testing.T) {
	old := started.Add(48 * time.Hour).Format(time.RFC3339)
	f := newFixture(t, nightly(map[string]string{
		"erasure.lethe.dev/erased-uid-1": old,
		"erasure.lethe.dev/erased-uid-2": "forget-someone", // the oldest form held the request's name
		"team.example/keep":              "x",
	}, started.Add(365*24*time.Hour)))
	req := backups.Request{UID: "uid-3", DeletedAt: started.Add(72 * time.Hour), Window: time.Hour}
	if _, err := f.r.Rotate(context.Background(), f.sc, req); err != nil {
		t.Fatal(err)
	}
	b := f.backup(t)
	for k := range b.Annotations {
		if strings.HasPrefix(k, "erasure.lethe.dev/erased-") {
			t.Fatalf("per-request annotation %s left: %v", k, b.Annotations)
		}
	}
	s := backups.ReadSummary(b.Annotations)
	if s.Count != 3 || s.EarliestDeadline != old || s.RequestsDigest != backups.RequestsDigest([]string{"uid-1", "uid-2", "uid-3"}) ||
		b.Annotations["team.example/keep"] != "x" {
		t.Fatalf("summary %+v, annotations %v", s, b.Annotations)
	}
}

// An immediate request deletes Backups only where the store allows it;
// otherwise it shortens them like any request. The retention floor keeps a
// Backup past the deadline, and nothing lengthens an expiration.
func TestImmediatePolicyAndRetentionFloor(t *testing.T) {
	deleted := started.Add(24 * time.Hour)
	req := backups.Request{UID: "u", DeletedAt: deleted, Window: time.Hour, Immediate: true}
	cases := map[string]struct {
		deleteOnImmediate bool
		floor             time.Duration
		exp               time.Time
		wantExp           time.Time
		wantDBR           bool
	}{
		"ImmediateNotAllowed": {exp: started.Add(30 * 24 * time.Hour), wantExp: req.Deadline()},
		"ImmediateAllowed":    {deleteOnImmediate: true, exp: started.Add(30 * 24 * time.Hour), wantExp: started.Add(30 * 24 * time.Hour), wantDBR: true},
		"FloorPastDeadline":   {floor: 7 * 24 * time.Hour, exp: started.Add(30 * 24 * time.Hour), wantExp: started.Add(7 * 24 * time.Hour)},
		"FloorBeforeDeadline": {floor: time.Hour, exp: started.Add(30 * 24 * time.Hour), wantExp: req.Deadline()},
		"FloorNeverLengthens": {floor: 7 * 24 * time.Hour, exp: started.Add(2 * 24 * time.Hour), wantExp: started.Add(2 * 24 * time.Hour)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, nightly(nil, tc.exp))
			f.sc.DeleteOnImmediate, f.sc.MinRetention = tc.deleteOnImmediate, tc.floor
			got, err := f.r.Rotate(context.Background(), f.sc, req)
			if err != nil {
				t.Fatal(err)
			}
			dbrs := &velerov1.DeleteBackupRequestList{}
			if err := f.c.List(context.Background(), dbrs); err != nil {
				t.Fatal(err)
			}
			if b := f.backup(t); !b.Status.Expiration.Time.Equal(tc.wantExp) || (len(dbrs.Items) > 0) != tc.wantDBR ||
				(got[0].DeleteRequest != "") != tc.wantDBR {
				t.Fatalf("expiration %s (want %s), %d DeleteBackupRequest(s) (want one: %v)", b.Status.Expiration.Time, tc.wantExp, len(dbrs.Items), tc.wantDBR)
			}
		})
	}
}

// The summary is JSON with the documented fields.
func TestSummaryFormat(t *testing.T) {
	f := newFixture(t, nightly(nil, started.Add(365*24*time.Hour)))
	if _, err := f.r.Rotate(context.Background(), f.sc, backups.Request{UID: "u", DeletedAt: started.Add(time.Hour), Window: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(f.backup(t).Annotations[backups.AnnotationErasures]), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"count", "earliestDeadline", "requestsDigest", "recent"} {
		if _, ok := m[k]; !ok {
			t.Errorf("summary has no %q: %v", k, m)
		}
	}
}

// A request rotates its Backups on every pass until they expire. Once its
// evidence lists a Backup, a later pass does not count it again — also
// after more requests than the summary remembers marked the Backup since.
func TestSummaryCountsARequestOnceAcrossPasses(t *testing.T) {
	f := newFixture(t, nightly(nil, started.Add(365*24*time.Hour)))
	first := backups.Request{UID: "first", DeletedAt: started.Add(time.Hour), Window: time.Hour}
	if _, err := f.r.Rotate(context.Background(), f.sc, first); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		req := backups.Request{UID: fmt.Sprintf("other-%d", i), DeletedAt: started.Add(2 * time.Hour), Window: time.Hour}
		if _, err := f.r.Rotate(context.Background(), f.sc, req); err != nil {
			t.Fatal(err)
		}
	}
	first.Recorded = map[string]bool{"nightly": true}
	if _, err := f.r.Rotate(context.Background(), f.sc, first); err != nil {
		t.Fatal(err)
	}
	if s := backups.ReadSummary(f.backup(t).Annotations); s.Count != 41 {
		t.Fatalf("summary counts %d requests after a later pass of the first, want 41", s.Count)
	}
}
