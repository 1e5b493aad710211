package erasurecli

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// The API's own rules, checked here first so that a typo is reported
// before anything reaches the cluster (and before --export prints a
// manifest the API server would refuse).
var sessionID = regexp.MustCompile(lethev1.SessionIDPattern)

// maxSessions is the API's limit on spec.sessionIDs.
const maxSessions = 1000

// specFlags are the flags that fill an ErasureRequest's spec; create and
// plan share them so that they validate alike.
type specFlags struct {
	store       string
	ids         []string
	idsFile     string
	immediate   bool
	reason      string
	grace       time.Duration
	requestedAt string
}

func (s *specFlags) addFlags(f *pflag.FlagSet) {
	f.StringVar(&s.store, "store", "", "the MemoryStore in the request's namespace (required)")
	f.StringArrayVar(&s.ids, "session-id", nil, "a session to erase (repeatable)")
	f.StringVar(&s.idsFile, "session-ids-from", "", "a file with one session ID per line ('-' for standard input)")
	f.BoolVar(&s.immediate, "immediate", false, "skip the grace period (needs --reason)")
	f.StringVar(&s.reason, "reason", "", "why the grace period is skipped, e.g. a ticket number (kept in the evidence: no personal data)")
	f.DurationVar(&s.grace, "grace", 0, "grace period before deletion (default 168h, the API's default)")
	f.StringVar(&s.requestedAt, "requested-at", "", "when the data subject asked, RFC 3339 (default: when the request is created); the one-month deadline runs from it")
}

// request validates the flags and builds the ErasureRequest. Every problem
// is reported at once; stdin is read for --session-ids-from -. now is the
// clock --requested-at is checked against.
func (s *specFlags) request(name, ns string, stdin io.Reader, now time.Time) (*lethev1.ErasureRequest, error) {
	ids := append([]string(nil), s.ids...)
	if s.idsFile != "" {
		more, err := readIDs(s.idsFile, stdin)
		if err != nil {
			return nil, err
		}
		ids = append(ids, more...)
	}
	problems := s.nameProblems(name)
	problems = append(problems, idProblems(ids)...)
	problems = append(problems, s.graceProblems()...)
	requestedAt, more := s.requestedAtTime(now)
	problems = append(problems, more...)
	if len(problems) > 0 {
		return nil, fmt.Errorf("invalid request:\n  %s", strings.Join(problems, "\n  "))
	}
	er := &lethev1.ErasureRequest{
		TypeMeta:   metav1.TypeMeta{APIVersion: lethev1.GroupVersion.String(), Kind: "ErasureRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: s.store},
			Immediate: s.immediate, Reason: s.reason, RequestedAt: requestedAt},
	}
	for _, id := range ids {
		er.Spec.SessionIDs = append(er.Spec.SessionIDs, lethev1.SessionID(id))
	}
	if s.grace > 0 {
		er.Spec.GracePeriod = &metav1.Duration{Duration: s.grace}
	}
	return er, nil
}

// nameProblems checks the request's name and --store.
func (s *specFlags) nameProblems(name string) []string {
	var problems []string
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		problems = append(problems, fmt.Sprintf("name %q: %s", name, msg))
	}
	if s.store == "" {
		return append(problems, "--store is required")
	}
	for _, msg := range validation.IsDNS1123Subdomain(s.store) {
		problems = append(problems, fmt.Sprintf("--store %q: %s", s.store, msg))
	}
	return problems
}

// idProblems checks the session IDs as the API does.
func idProblems(ids []string) []string {
	var problems []string
	if len(ids) == 0 {
		problems = append(problems, "at least one --session-id (or --session-ids-from) is required")
	}
	if len(ids) > maxSessions {
		problems = append(problems, fmt.Sprintf("%d session IDs: at most %d per request", len(ids), maxSessions))
	}
	seen := map[string]bool{}
	for _, id := range ids {
		switch {
		case seen[id]:
			problems = append(problems, fmt.Sprintf("session %q is listed twice", id))
		case !sessionID.MatchString(id):
			problems = append(problems, fmt.Sprintf("%q is not a lowercase canonical UUID", id))
		}
		seen[id] = true
	}
	return problems
}

// graceProblems checks --immediate, --reason and --grace together.
func (s *specFlags) graceProblems() []string {
	var problems []string
	if s.immediate && strings.TrimSpace(s.reason) == "" {
		problems = append(problems, "--immediate needs --reason")
	}
	if len(s.reason) > 1024 {
		problems = append(problems, "--reason is longer than 1024 bytes")
	}
	if s.immediate && s.grace != 0 {
		problems = append(problems, "--immediate and --grace exclude each other")
	}
	if s.grace < 0 {
		problems = append(problems, "--grace must not be negative")
	}
	return problems
}

// requestedAtTime parses --requested-at (nil when unset).
func (s *specFlags) requestedAtTime(now time.Time) (*metav1.Time, []string) {
	if s.requestedAt == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339, s.requestedAt)
	switch {
	case err != nil:
		return nil, []string{fmt.Sprintf("--requested-at %q is not an RFC 3339 time such as 2026-11-02T09:30:00Z", s.requestedAt)}
	case t.After(now):
		return nil, []string{"--requested-at is in the future: it is when the data subject asked"}
	}
	// The API keeps whole seconds; truncating here makes the exported
	// manifest say exactly what the server will store.
	return &metav1.Time{Time: t.UTC().Truncate(time.Second)}, nil
}

// deadlinePassed says whether requestedAt is more than a calendar month ago:
// the request is still valid (the erasure is owed) but already late.
func deadlinePassed(er *lethev1.ErasureRequest, now time.Time) bool {
	r := er.Spec.RequestedAt
	return r != nil && r.AddDate(0, 1, 0).Before(now)
}

func readIDs(path string, stdin io.Reader) ([]string, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }()
		r = f
	}
	var ids []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ids = append(ids, line)
	}
	return ids, sc.Err()
}
