package erasurecli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// receiptsFlags are the receipts command's own flags.
type receiptsFlags struct {
	store, databaseURL, checkpoint, saveCheckpoint string
	keys                                           keyFlags
}

func newReceipts(o *options) *cobra.Command {
	f := &receiptsFlags{}
	cmd := &cobra.Command{
		Use:   "receipts --store NAME",
		Short: "Verify the proofs a store's database holds and its append-only receipt log",
		Long: `Reads what the store's database holds (lethe.erasure_proofs and the receipt log),
including the proofs of requests whose objects were deleted, and verifies each
one like 'verify' does, then the log: every leaf, every signed checkpoint, and,
with --checkpoint FILE (one you saved earlier with --save-checkpoint), that no
receipt was removed or changed since (a consistency proof).

The database is reached with the store's connection Secret, or --database-url
(e.g. through 'kubectl port-forward'). Exits 1 when anything does not verify.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.receipts(cmd.Context(), f) },
	}
	cmd.Flags().StringVar(&f.store, "store", "", "the MemoryStore whose database to read (required)")
	cmd.Flags().StringVar(&f.databaseURL, "database-url", "", "connect with this PostgreSQL URL instead of the store's Secret")
	cmd.Flags().StringVar(&f.checkpoint, "checkpoint", "", "a checkpoint file saved earlier: prove the log still contains everything it did")
	cmd.Flags().StringVar(&f.saveCheckpoint, "save-checkpoint", "", "write the log's latest signed checkpoint to this file, to hold for next time")
	f.keys.add(cmd)
	_ = cmd.MarkFlagRequired("store")
	_ = cmd.RegisterFlagCompletionFunc("store", o.completeStores)
	return cmd
}

func (o *options) receipts(ctx context.Context, f *receiptsFlags) error {
	cl, ns, err := o.client()
	if err != nil {
		return err
	}
	store := &lethev1.MemoryStore{}
	if err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: f.store}, store); err != nil {
		return err
	}
	ks, _, err := f.keys.load(ctx, cl)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	pool, err := o.storeDatabase(ctx, cl, store, f.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool}
	origin := receiptlog.Origin(string(store.UID))
	proofs, err := e.ReadProofs(ctx, origin)
	if err != nil {
		return err
	}
	live, err := liveRequests(ctx, cl, store)
	if err != nil {
		return err
	}
	held, other, err := heldCheckpoints(f.checkpoint, origin, live)
	if err != nil {
		return err
	}
	bad := o.printProofs(ctx, proofs, live, ks, f.keys.allowUnsigned)
	recs, cps, err := e.ReadLog(ctx, origin)
	if err != nil {
		return err
	}
	audit, err := auditStoreLog(store, recs, cps, proofs, held, ks)
	if err != nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("store %s does NOT verify: %w", store.Name, err)}
	}
	fmt.Fprintf(o.streams.Out, "receipt log %s: %d receipts, root %x, %d signed checkpoints verify\n",
		receiptlog.Origin(string(store.UID)), audit.Size, audit.Root[:8], audit.Checkpoints)
	for _, h := range held {
		fmt.Fprintf(o.streams.Out, "consistent with %s: no receipt removed or changed since\n", h.Source)
	}
	for _, s := range other {
		fmt.Fprintf(o.streams.Out, "not held against this log: %s is of another log (the store was created again under its name)\n", s)
	}
	if f.saveCheckpoint != "" {
		if audit.Latest == nil {
			return &ExitError{Code: 1, Err: fmt.Errorf("store %s: no signed checkpoint covers the whole log (%d receipts): nothing saved to %s", store.Name, audit.Size, f.saveCheckpoint)}
		}
		if err := os.WriteFile(f.saveCheckpoint, audit.Latest, 0o644); err != nil {
			return err
		}
	}
	if bad > 0 {
		return &ExitError{Code: 1, Err: fmt.Errorf("store %s: %d proof(s) do NOT verify", store.Name, bad)}
	}
	fmt.Fprintln(o.streams.Out, "verified")
	return nil
}

// storeDatabase connects to the store's database.
func (o *options) storeDatabase(ctx context.Context, cl client.Client, store *lethev1.MemoryStore, url string) (*pgxpool.Pool, error) {
	if url == "" {
		ref := store.Spec.Postgres.DSNSecretRef
		secret := &corev1.Secret{}
		if err := cl.Get(ctx, types.NamespacedName{Namespace: store.Namespace, Name: ref.Name}, secret); err != nil {
			return nil, fmt.Errorf("read the store's connection Secret (or pass --database-url): %w", err)
		}
		url = string(secret.Data[ref.Key])
	}
	pool, err := postgres.Connect(ctx, url, postgres.Options{})
	if err != nil {
		return nil, fmt.Errorf("connect to the store's database: %w", err)
	}
	return pool, nil
}

// heldCheckpoints are the checkpoints kept outside the database: the
// auditor's file, and those the store's live requests carry of its log
// (origin). A request's checkpoint of another log (its store deleted and
// created again under its name: a new UID, a new log) cannot be held
// against this one: it is listed in other, by its source.
func heldCheckpoints(file, origin string, live []lethev1.ErasureRequest) (held []evidence.HeldCheckpoint, other []string, err error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, nil, err
		}
		held = append(held, evidence.HeldCheckpoint{Source: "the checkpoint in " + file, Note: b})
	}
	for _, er := range live {
		r := er.Status.Receipt
		if r == nil || r.Log == nil {
			continue
		}
		source := "the checkpoint request " + er.Name + " holds"
		if receiptlog.NoteOrigin(r.Log.Checkpoint) != origin {
			other = append(other, source)
			continue
		}
		held = append(held, evidence.HeldCheckpoint{Source: source, Note: []byte(r.Log.Checkpoint)})
	}
	return held, other, nil
}

// liveRequests are the store's requests in the cluster.
func liveRequests(ctx context.Context, cl client.Client, store *lethev1.MemoryStore) ([]lethev1.ErasureRequest, error) {
	list := &lethev1.ErasureRequestList{}
	if err := cl.List(ctx, list, client.InNamespace(store.Namespace)); err != nil {
		return nil, err
	}
	var out []lethev1.ErasureRequest
	for _, er := range list.Items {
		if er.Spec.StoreRef.Name == store.Name {
			out = append(out, er)
		}
	}
	return out, nil
}

// printProofs verifies and lists each proof; it returns how many fail.
func (o *options) printProofs(ctx context.Context, proofs []erasure.Proof, live []lethev1.ErasureRequest, ks evidence.KeySet, allowUnsigned bool) int {
	names := map[types.UID]string{}
	for _, er := range live {
		names[er.UID] = er.Name
	}
	t := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "Request UID", Type: "string"}, {Name: "Object", Type: "string"}, {Name: "Entries", Type: "integer"},
		{Name: "Key", Type: "string"}, {Name: "Verified", Type: "string"}}}
	bad := 0
	for _, p := range proofs {
		verdict, err := verifyProof(ctx, p, ks, allowUnsigned)
		if err != nil {
			verdict, bad = "NO: "+err.Error(), bad+1
		}
		object := "gone"
		if name, ok := names[types.UID(p.UID)]; ok {
			object = name
		}
		t.Rows = append(t.Rows, metav1.TableRow{Cells: []any{p.UID, object, strconv.Itoa(len(p.History)), dash(short(p.KeyID)), verdict}})
	}
	if len(t.Rows) == 0 {
		fmt.Fprintln(o.streams.Out, "the database holds no proof")
	} else if err := printTable(o.streams.Out, t, false); err != nil {
		fmt.Fprintln(o.streams.ErrOut, err)
	}
	return bad
}

func verifyProof(ctx context.Context, p erasure.Proof, ks evidence.KeySet, allowUnsigned bool) (string, error) {
	doc, _ := p.Document.(json.RawMessage)
	receipt := &lethev1.Receipt{Digest: p.Digest, Envelope: p.Envelope, KeyID: p.KeyID, IssuedAt: &metav1.Time{Time: p.IssuedAt}}
	er, sessions, err := evidence.RequestFromProof(p.UID, p.Format, p.History, receipt, doc)
	if err != nil {
		return "", err
	}
	// Unsigned is accepted (when allowed) for a legacy proof only.
	rep, err := evidence.VerifyRequest(ctx, er, evidence.Options{KeySet: ks, AllowUnsigned: allowUnsigned && p.Format == "", SessionsDigest: sessions})
	if err != nil {
		return "", err
	}
	if rep.Unsigned {
		return "UNSIGNED (legacy chain: proves only that nothing changed since)", nil
	}
	return "yes", nil
}

// auditStoreLog checks each leaf against the proof it records (the proof's
// history has that head at that length), then the log itself.
func auditStoreLog(store *lethev1.MemoryStore, recs []postgres.LogRecord, cps []postgres.StoredCheckpoint, proofs []erasure.Proof,
	held []evidence.HeldCheckpoint, ks evidence.KeySet) (evidence.LogAudit, error) {
	byUID := map[string][]lethev1.HistoryEntry{}
	for _, p := range proofs {
		byUID[p.UID] = p.History
	}
	logged := map[string]bool{}
	for _, r := range recs {
		logged[fmt.Sprintf("%s/%d", r.RequestUID, r.HistoryLength)] = true
	}
	origin := receiptlog.Origin(string(store.UID))
	for _, p := range proofs {
		// A proof that went on in another store's log (its store created
		// again) has its last leaf there.
		mine := p.Log == "" || p.Log == origin
		if mine && p.Format != "" && !logged[fmt.Sprintf("%s/%d", p.UID, len(p.History))] {
			return evidence.LogAudit{}, fmt.Errorf("receipt log: the proof of request %s (history length %d) has no leaf: removed from the log", p.UID, len(p.History))
		}
	}
	leaves := make([]evidence.LogLeafRecord, len(recs))
	for i, r := range recs {
		leaves[i] = evidence.LogLeafRecord{Index: r.Index, Data: r.LeafData, Hash: r.LeafHash}
		h := byUID[r.RequestUID]
		if r.HistoryLength < 1 || r.HistoryLength > len(h) ||
			string(evidence.LogLeaf(r.RequestUID, h[r.HistoryLength-1].Digest, r.HistoryLength)) != r.LeafData {
			return evidence.LogAudit{}, fmt.Errorf("receipt log: leaf %d does not record the proof of request %s at history length %d", i, r.RequestUID, r.HistoryLength)
		}
	}
	notes := make([][]byte, len(cps))
	for i, c := range cps {
		notes[i] = []byte(c.Note)
	}
	if len(notes) == 0 && len(leaves) > 0 {
		return evidence.LogAudit{}, errors.New("receipt log: no signed checkpoint recorded")
	}
	return evidence.AuditLog(origin, leaves, notes, held, ks)
}
