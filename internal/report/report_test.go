package report_test

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lethe-dev/lethe/internal/report"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func ptr(s string) *time.Time {
	t := at(s)
	return &t
}

const (
	keyOld = "3f9a61c0d2b84e7a9c1d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b"
	keyNew = "a41be07c5d2f4a6e8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a"
)

// verified is a filled certificate of a request that went all the way.
func verified() report.Certificate {
	return report.Certificate{
		Request: report.RequestInfo{
			Namespace: "tenant-acme", Name: "erase-ticket-4711", UID: "5d0c8e1a-7b3f-4c2e-9a61-0f4e2b7d9c35",
			Store: "acme-memory", Sessions: 3, SessionsFound: 2, SessionsNotFound: 1,
			RequestedAt: at("2026-11-03T09:14:07Z"), Deadline: at("2026-12-03T09:14:07Z"),
			Phase: "BackupsRotated",
		},
		Milestones: []report.Milestone{
			{Phase: "Pending", Time: at("2026-11-03T09:14:07Z"), KeyID: keyNew},
			{Phase: "Planned", Time: at("2026-11-03T09:14:09Z"), KeyID: keyNew},
			{Phase: "Tombstoned", Time: at("2026-11-03T09:14:10Z"), KeyID: keyNew},
			{Phase: "GracePeriod", Time: at("2026-11-03T09:14:10Z")},
			{Phase: "Deleted", Time: at("2026-11-10T09:14:31Z"), KeyID: keyNew},
			{Phase: "GraphReconciled", Time: at("2026-11-10T09:14:44Z"), KeyID: keyNew},
			{Phase: "BackupsRotated", Event: "BackupsExpired", Time: at("2026-11-24T02:00:12Z"), KeyID: keyNew},
		},
		Plan: []report.Count{
			{Table: "memory.sessions", Rows: 2}, {Table: "memory.rounds", Rows: 184},
			{Table: "memory.facts", Rows: 57}, {Table: "memory.artifacts", Rows: 9},
		},
		Steps: []report.Step{
			{
				Name: "Tombstoned", StartedAt: ptr("2026-11-03T09:14:09Z"), CompletedAt: ptr("2026-11-03T09:14:10Z"),
				Counts: []report.Count{{Table: "memory.sessions", Rows: 2}},
				Checks: []report.Check{{Check: "sessions readable by the application", Found: 0}},
			},
			{
				Name: "Deleted", StartedAt: ptr("2026-11-10T09:14:29Z"), CompletedAt: ptr("2026-11-10T09:14:31Z"),
				VacuumedAt: ptr("2026-11-10T09:15:02Z"),
				Counts: []report.Count{
					{Table: "memory.sessions", Rows: 2}, {Table: "memory.rounds", Rows: 184},
					{Table: "memory.facts", Rows: 57}, {Table: "memory.artifacts", Rows: 9},
				},
				Checks: []report.Check{
					{Check: "rows referencing the sessions in memory.rounds", Found: 0},
					{Check: "rows referencing the sessions in memory.facts", Found: 0},
					{Check: "embeddings nearest to the erased ones (probe)", Found: 0},
				},
				Note: "probed 50 of 241 embeddings",
			},
			{
				Name: "GraphReconciled", StartedAt: ptr("2026-11-10T09:14:40Z"), CompletedAt: ptr("2026-11-10T09:14:44Z"),
				Counts: []report.Count{{Table: "Entity nodes", Rows: 31}, {Table: "MENTIONS relationships", Rows: 76}},
				Checks: []report.Check{{Check: "graph elements derived only from the sessions", Found: 0}},
			},
		},
		Backups: []report.Backup{
			{
				Name: "daily-20261102020000", StartedAt: ptr("2026-11-02T02:00:00Z"),
				OriginalExpiration: ptr("2026-12-02T02:00:00Z"), Expiration: ptr("2026-11-24T02:00:00Z"),
				GoneAt: ptr("2026-11-24T02:00:12Z"),
			},
			{
				Name: "daily-20261103020000", StartedAt: ptr("2026-11-03T02:00:00Z"),
				OriginalExpiration: ptr("2026-12-03T02:00:00Z"), Expiration: ptr("2026-11-24T02:00:00Z"),
			},
		},
		Verification: report.Verification{OK: true, Checks: []string{
			"The history chain of 7 entries recomputes to the receipt's digest.",
			"The receipt's signature verifies with key a41be07c5d2f, valid when it was issued.",
			"The receipt is entry 1208 of the transparency log, and the inclusion proof verifies against its checkpoint.",
		}},
		Keys: []report.Key{
			{ID: keyOld, Validity: "from 2026-01-15T00:00:00Z until 2026-11-01T00:00:00Z"},
			{ID: keyNew, Validity: "from 2026-11-01T00:00:00Z, still current"},
		},
		Receipt: &report.ReceiptInfo{
			Digest:   "sha256:9b2e51f0c4d7a8e3b6f1c0d9e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9",
			KeyID:    keyNew,
			IssuedAt: at("2026-11-24T02:00:13Z"),
		},
		Log:            &report.LogInfo{Origin: "receipts.lethe.example/acme", Index: 1208, Size: 1342},
		EvidenceFormat: "lethe.evidence/v1",
		LetheVersion:   "v0.9.0",
		GeneratedAt:    at("2026-11-25T10:00:00Z"),
	}
}

// failing is the same certificate after its bundle failed to verify.
func failing() report.Certificate {
	c := verified()
	c.Verification = report.Verification{
		Failure: "history entry 4 does not verify: digest does not match the entry's content (edited?)",
	}
	return c
}

func render(t *testing.T, c report.Certificate) string {
	t.Helper()
	var b bytes.Buffer
	if err := report.RenderHTML(&b, c); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

var bannerRE = regexp.MustCompile(`(?s)<section id="verification".*?</section>`)

// banner is the verification banner's HTML.
func banner(t *testing.T, page string) string {
	t.Helper()
	b := bannerRE.FindString(page)
	if b == "" {
		t.Fatalf("no verification banner in the page:\n%s", page)
	}
	return b
}

func TestVerifiedCertificateHoldsWhatWasErased(t *testing.T) {
	c := verified()
	page := render(t, c)

	want := []string{c.Request.UID, c.Request.Namespace + "/" + c.Request.Name, c.Request.Store, "Certificate of erasure"}
	for _, s := range c.Steps {
		want = append(want, "<h3>"+s.Name+"</h3>")
		for _, n := range s.Counts {
			want = append(want, "<td>"+n.Table+`</td><td class="num">`+strconv.FormatInt(n.Rows, 10)+"</td>")
		}
		for _, ch := range s.Checks {
			want = append(want, "<td>"+ch.Check+`</td><td class="num absent">absent</td>`)
		}
	}
	for _, b := range c.Backups {
		want = append(want, "<td>"+b.Name)
	}
	want = append(want,
		"2026-11-24T02:00:12Z",                 // the first backup is gone
		`<span class="pending">pending</span>`, // the second is not yet
		"unsigned",                             // the GracePeriod milestone
		keyNew[:12], keyOld, c.Receipt.Digest, c.Log.Origin, c.EvidenceFormat, c.LetheVersion,
	)
	for _, w := range want {
		if !strings.Contains(page, w) {
			t.Errorf("the page does not contain %q", w)
		}
	}

	b := banner(t, page)
	if !strings.Contains(b, "Verified") || !strings.Contains(b, `class="banner ok"`) {
		t.Errorf("the banner does not say Verified:\n%s", b)
	}
	for _, check := range c.Verification.Checks {
		if !strings.Contains(b, escaped(check)) {
			t.Errorf("the banner does not list the check %q:\n%s", check, b)
		}
	}
	if strings.Contains(page, "NOT VERIFIED") {
		t.Error("a verified certificate says NOT VERIFIED")
	}
}

// escaped is s as html/template escapes text.
func escaped(s string) string {
	return strings.ReplaceAll(s, "'", "&#39;")
}

func TestFailingCertificateSaysNotVerified(t *testing.T) {
	c := failing()
	page := render(t, c)
	b := banner(t, page)
	if !strings.Contains(b, "NOT VERIFIED") || !strings.Contains(b, `class="banner failed"`) {
		t.Errorf("the banner does not say NOT VERIFIED:\n%s", b)
	}
	if !strings.Contains(b, escaped(c.Verification.Failure)) {
		t.Errorf("the banner does not hold the failure %q:\n%s", c.Verification.Failure, b)
	}
	if strings.Contains(b, "Verified") {
		t.Errorf("the failing banner says Verified:\n%s", b)
	}
	if strings.Contains(page, "Verified") {
		t.Error("a failing certificate says Verified somewhere")
	}
	// A failing result carries no passed checks into the banner, even when
	// the caller left some in the model.
	c.Verification.Checks = []string{"The history chain recomputes."}
	if b := banner(t, render(t, c)); strings.Contains(b, "recomputes") {
		t.Errorf("the failing banner lists a passed check:\n%s", b)
	}
}

func TestEveryValueIsEscaped(t *testing.T) {
	const evil = `<script>alert("erased")</script>`
	c := verified()
	c.Request.Name = evil
	c.Steps[0].Note = evil
	c.Steps[1].Counts[0].Table = evil
	c.Backups[0].Name = evil
	c.Verification.Checks = append(c.Verification.Checks, evil)
	f := failing()
	f.Verification.Failure = evil
	for _, page := range []string{render(t, c), render(t, f)} {
		if strings.Contains(strings.ToLower(page), "<script") {
			t.Fatalf("a value reached the page unescaped:\n%s", page)
		}
		if !strings.Contains(page, "&lt;script&gt;") {
			t.Fatalf("the escaped value is missing:\n%s", page)
		}
	}
}

// The page is self-contained: nothing for a browser to fetch or run.
func TestPageIsSelfContained(t *testing.T) {
	page := strings.ToLower(render(t, verified()))
	for _, bad := range []string{"<script", "<link", "<img", "<iframe", " src=", " href=", "url(", "@import", "javascript:"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page holds %q", bad)
		}
	}
}

func TestMissingPartsAreSaidSo(t *testing.T) {
	c := verified()
	c.Receipt, c.Log, c.Backups, c.Keys = nil, nil, nil, nil
	c.Steps[0].StartedAt = nil
	page := render(t, c)
	for _, w := range []string{"No receipt.", "Not logged.", "No keys.", "No backup that may hold", "— → 2026-11-03T09:14:10Z"} {
		if !strings.Contains(page, w) {
			t.Errorf("the page does not contain %q", w)
		}
	}
}

func TestImmediateRequestSaysTheGracePeriodWasSkipped(t *testing.T) {
	c := verified()
	if page := render(t, c); !strings.Contains(page, "<dt>Grace period</dt><dd>observed</dd>") {
		t.Error("a request with a grace period does not say it was observed")
	}
	c.Request.Immediate = true
	c.Backups[1].DeleteBackupRequest = "erase-ticket-4711-daily-20261103020000"
	page := render(t, c)
	for _, w := range []string{"<strong>skipped</strong> (immediate erasure)", "deletion: erase-ticket-4711-daily-20261103020000"} {
		if !strings.Contains(page, w) {
			t.Errorf("an immediate request's page does not contain %q", w)
		}
	}
}

func TestCheckFoundIsShownAsFound(t *testing.T) {
	c := failing()
	c.Steps[1].Checks[1].Found = 3
	page := render(t, c)
	if !strings.Contains(page, `<td class="num present">found 3</td>`) {
		t.Error("a check that found 3 rows is not shown as found 3")
	}
}

func TestTimesAreUTC(t *testing.T) {
	c := verified()
	c.Request.RequestedAt = at("2026-11-03T10:14:07+01:00")
	if page := render(t, c); !strings.Contains(page, "2026-11-03T09:14:07Z") || strings.Contains(page, "+01:00") {
		t.Error("the request time is not shown in UTC")
	}
}

// --- screenshot -------------------------------------------------------------

const (
	shotWidth, shotHeight = 900, 1400
	// bannerBand is the top of the screenshot the banner must fall in.
	bannerBand = 320
)

func chromiumPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("LETHE_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("chromium not found at %s (%v): run `hack/install-chromium.sh` (`make chromium`; `make test` runs it)", p, err)
	}
	return p
}

// writeHTML renders c into dir/name.html.
func writeHTML(t *testing.T, dir, name string, c report.Certificate) string {
	t.Helper()
	html := filepath.Join(dir, name+".html")
	f, err := os.Create(html)
	if err != nil {
		t.Fatal(err)
	}
	if err := report.RenderHTML(f, c); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return html
}

// screenshot renders c in headless Chromium and returns the PNG's path.
func screenshot(t *testing.T, chromium string, c report.Certificate, name string) string {
	t.Helper()
	dir := t.TempDir()
	html := writeHTML(t, dir, name, c)
	out := filepath.Join(dir, name+".png")
	runChromium(t, chromium, dir, out, "--hide-scrollbars", fmt.Sprintf("--window-size=%d,%d", shotWidth, shotHeight),
		"--screenshot="+out, "file://"+html)
	if d := os.Getenv("LETHE_REPORT_SCREENSHOT_DIR"); d != "" {
		copyFile(t, out, filepath.Join(d, name+".png"))
	}
	return out
}

// runChromium runs headless Chromium with a new profile under dir and the
// given arguments, and checks that it wrote out.
func runChromium(t *testing.T, chromium, dir, out string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + filepath.Join(dir, "profile")}, args...)
	cmd := exec.CommandContext(ctx, chromium, args...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	// Its own process group: on a timeout, and after it exits, whatever it
	// left behind (renderer, crash handler) is stopped with it, by its group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		t.Fatalf("chromium: %v (context: %v)\n%s", err, ctx.Err(), log.String())
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatalf("chromium wrote nothing to %s: %v\n%s", out, err, log.String())
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot copied to %s", to)
}

func decode(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	return img
}

// pixelStats counts, over the rows [y0, y1), the pixels of each kind.
type pixelStats struct {
	total, nonWhite, green, red int
	colors                      map[uint32]bool
}

func stats(img image.Image, y0, y1 int) pixelStats {
	s := pixelStats{colors: map[uint32]bool{}}
	b := img.Bounds()
	for y := b.Min.Y + y0; y < b.Min.Y+y1 && y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			r, g, bl = r>>8, g>>8, bl>>8
			s.total++
			s.colors[r<<16|g<<8|bl] = true
			if r < 240 || g < 240 || bl < 240 {
				s.nonWhite++
			}
			if g > r+50 && g > bl+40 {
				s.green++
			}
			if r > g+80 && r > bl+80 {
				s.red++
			}
		}
	}
	return s
}

func TestCertificateRendersInChromium(t *testing.T) {
	chromium := chromiumPath(t)
	for _, tc := range []struct {
		name string
		cert report.Certificate
		ok   bool
	}{
		{"certificate-verified", verified(), true},
		{"certificate-not-verified", failing(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := screenshot(t, chromium, tc.cert, tc.name)
			t.Logf("screenshot: %s", path)
			img := decode(t, path)
			if b := img.Bounds(); b.Dx() != shotWidth || b.Dy() != shotHeight {
				t.Fatalf("screenshot is %dx%d, want %dx%d", b.Dx(), b.Dy(), shotWidth, shotHeight)
			}
			all := stats(img, 0, shotHeight)
			if len(all.colors) < 50 || all.nonWhite < all.total/50 {
				t.Errorf("the screenshot looks blank: %d colors, %d of %d pixels not white", len(all.colors), all.nonWhite, all.total)
			}
			// The banner is a solid band of several thousand pixels near the top.
			top := stats(img, 0, bannerBand)
			const many = 20000
			want, other := top.green, top.red
			if !tc.ok {
				want, other = top.red, top.green
			}
			if want < many {
				t.Errorf("the banner band holds %d pixels of the verdict's colour (ok=%v), want at least %d", want, tc.ok, many)
			}
			if other > many/10 {
				t.Errorf("the banner band holds %d pixels of the other verdict's colour (ok=%v)", other, tc.ok)
			}
		})
	}
}

var pageCountRE = regexp.MustCompile(`/Type\s*/Pages\b[^>]*?/Count\s+(\d+)|/Count\s+(\d+)[^>]*?/Type\s*/Pages\b`)

// The certificate is one page: printed to A4 (what the print stylesheet
// sets), the filled certificate takes a single page.
func TestCertificatePrintsOnOneA4Page(t *testing.T) {
	chromium := chromiumPath(t)
	for name, c := range map[string]report.Certificate{"verified": verified(), "not-verified": failing()} {
		dir := t.TempDir()
		html := writeHTML(t, dir, name, c)
		out := filepath.Join(dir, name+".pdf")
		runChromium(t, chromium, dir, out, "--no-pdf-header-footer", "--print-to-pdf="+out, "file://"+html)
		pdf, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		m := pageCountRE.FindSubmatch(pdf)
		if m == nil {
			t.Fatalf("%s: no page count in the PDF Chromium printed", name)
		}
		if n := string(m[1]) + string(m[2]); n != "1" {
			t.Errorf("%s: the certificate prints on %s A4 pages, want 1", name, n)
		}
	}
}
