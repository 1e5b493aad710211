package testenv

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// APIRequests counts the requests an API server has served since it
// started, by "VERB resource[/subresource]" (apiserver_request_total, read
// from its /metrics). Two readings' Sub is what was asked in between, by
// every client: a harness's own polling shows up there as much as the
// manager's calls. The API server counts a watch when it ends: one still
// open at the second reading is not in the difference.
type APIRequests map[string]float64

// APIRequests reads the API server's request counters.
func (c *ControlPlane) APIRequests(ctx context.Context) (APIRequests, error) {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API server's metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parse the API server's metrics: %w", err)
	}
	f, ok := families["apiserver_request_total"]
	if !ok {
		return nil, fmt.Errorf("the API server's metrics have no apiserver_request_total")
	}
	out := APIRequests{}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		key := labels["verb"] + " " + labels["resource"]
		if labels["resource"] == "" {
			key = labels["verb"] + " (discovery and other paths)"
		}
		if labels["subresource"] != "" {
			key += "/" + labels["subresource"]
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out, nil
}

// Sub is what r counts beyond before.
func (r APIRequests) Sub(before APIRequests) APIRequests {
	out := APIRequests{}
	for k, v := range r {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// Total is the count over every verb and resource.
func (r APIRequests) Total() float64 {
	var n float64
	for _, v := range r {
		n += v
	}
	return n
}

// Top names the n largest counts, largest first ("LIST erasurerequests 1985, ...").
func (r APIRequests) Top(n int) string {
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if r[keys[i]] != r[keys[j]] {
			return r[keys[i]] > r[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, 0, n)
	for _, k := range keys[:min(n, len(keys))] {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, r[k]))
	}
	return strings.Join(parts, ", ")
}
