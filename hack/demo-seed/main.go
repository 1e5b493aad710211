// Command demo-seed writes synthetic sessions into the dev stack's memory
// database for `make demo`: four sessions with rounds, facts, embeddings and
// cache entries, one cache entry shared by two sessions' identical text, and a
// profile derived from two sessions; then it derives the knowledge graph from
// the facts into FalkorDB, as the memory system would. Entities (Orion, Vega,
// Lyra, Draco) are shared between sessions. With -graph-counts it only
// prints how many nodes and relationships the graph holds, by label and type;
// with -backup-files NAME it lists the files Velero keeps in its bucket for
// the Backup NAME (through the object store's S3 API) and their count.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	pgxvec "github.com/pgvector/pgvector-go/pgx"

	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// The demo's sessions (fixed IDs, so the demo's requests can name them).
var sessions = []fixture.Session{
	{ID: "0d3c6f7e-1a2b-4c5d-8e9f-000000000001", Tenant: "default", Rounds: 4, Text: "synthetic transcript one about Orion and Vega", Seed: 1},
	{ID: "0d3c6f7e-1a2b-4c5d-8e9f-000000000002", Tenant: "default", Rounds: 3, Text: "synthetic transcript two about Vega and Draco", Seed: 2},
	{ID: "0d3c6f7e-1a2b-4c5d-8e9f-000000000003", Tenant: "default", Rounds: 5, Text: "synthetic transcript three about Orion and Lyra", Seed: 3},
	{ID: "0d3c6f7e-1a2b-4c5d-8e9f-000000000004", Tenant: "default", Rounds: 2, Text: "synthetic transcript four about Lyra", Seed: 4},
}

func main() {
	counts := flag.Bool("graph-counts", false, "print the graph's nodes and relationships by label and type, and exit")
	backupFiles := flag.String("backup-files", "", "list the files Velero keeps in its bucket for this Backup, and exit")
	flag.Parse()
	run := seed
	switch {
	case *counts:
		run = graphCounts
	case *backupFiles != "":
		run = func() error { return listBackupFiles(*backupFiles) }
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo-seed:", err)
		os.Exit(1)
	}
}

// memoryGraph opens the dev stack's graph "memory".
func memoryGraph() (*graph.Graph, func(), error) {
	url := os.Getenv("LETHE_FALKORDB_URL")
	if url == "" {
		return nil, nil, fmt.Errorf("LETHE_FALKORDB_URL is not set: source .dev/env first")
	}
	c, err := graph.Open(url)
	if err != nil {
		return nil, nil, err
	}
	return c.Graph("memory"), func() { _ = c.Close() }, nil
}

func graphCounts() error {
	g, done, err := memoryGraph()
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var parts []string
	for _, q := range []string{"MATCH (n) RETURN labels(n)[0], count(n) ORDER BY labels(n)[0]", "MATCH ()-[r]->() RETURN type(r), count(r) ORDER BY type(r)"} {
		res, err := g.ReadQuery(ctx, q, nil)
		if err != nil {
			return err
		}
		for res.Next() {
			rec := res.Record()
			k, _ := rec.GetByIndex(0)
			n, _ := rec.GetByIndex(1)
			parts = append(parts, fmt.Sprintf("%v=%v", k, n))
		}
	}
	fmt.Println(strings.Join(parts, " "))
	return nil
}

func seed() error {
	ctx := context.Background()
	dsn := os.Getenv("LETHE_PG_DSN")
	if dsn == "" {
		return fmt.Errorf("LETHE_PG_DSN is not set: source .dev/env first")
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	if err := pgxvec.RegisterTypes(ctx, conn); err != nil {
		return err
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM memory.sessions`).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil // already seeded
	}
	for _, s := range sessions {
		if err := fixture.Seed(ctx, conn, s); err != nil {
			return err
		}
	}
	// Identical text in sessions 1 and 3 shares one content-keyed cache entry.
	shared := "the same sentence said in two sessions"
	for i, id := range []string{sessions[0].ID, sessions[2].ID} {
		if _, err := conn.Exec(ctx, `INSERT INTO memory.rounds (session_id, round_index, user_text, content_sha256, embedding)
			VALUES ($1, 100, $2, $3, $4)`, id, shared, fixture.Sha256(shared), fixture.Embedding(99, 0)); err != nil {
			return err
		}
		if i == 0 {
			if _, err := conn.Exec(ctx, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding) VALUES ($1, $2, $3)`,
				fixture.Sha256(shared), shared, fixture.Embedding(99, 0)); err != nil {
				return err
			}
		}
	}
	if err := fixture.DeriveProfile(ctx, conn, "default", "project summary of sessions one and two", sessions[0].ID, sessions[1].ID); err != nil {
		return err
	}
	g, done, err := memoryGraph()
	if err != nil {
		return err
	}
	defer done()
	return fixture.DeriveGraph(ctx, conn, "memory", g)
}

// listBackupFiles prints the objects under backups/NAME/ in Velero's bucket
// and how many there are.
func listBackupFiles(name string) error {
	url := os.Getenv("LETHE_S3_URL")
	if url == "" {
		return fmt.Errorf("LETHE_S3_URL is not set: source .dev/env first")
	}
	store := &testenv.ObjectStore{URL: url}
	keys, err := store.Keys(testenv.VeleroBucket, "backups/"+name+"/")
	if err != nil {
		return err
	}
	for _, k := range keys {
		fmt.Printf("    s3://%s/%s\n", testenv.VeleroBucket, k)
	}
	fmt.Printf("    %d file(s) of Backup %s in the bucket\n", len(keys), name)
	return nil
}
