#!/usr/bin/env bash
# hack/demo.sh — Lethe on the local dev stack: starts the manager, creates the
# sample MemoryStore (Postgres with the reference schema, FalkorDB, Velero),
# waits for it to be Ready and shows it; then seeds synthetic sessions, applies
# an immediate request and one with a grace period, and prints what an
# auditor would read.
#
# The dev stack and the manager are stopped at the end; LETHE_DEMO_KEEP=1
# leaves them running (stop them with `make dev-down`).
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/lib.sh

command -v kubectl >/dev/null 2>&1 || die "the demo drives the cluster with kubectl, which is not on the PATH: install a kubectl within one minor version of Kubernetes ${KUBE_VERSION:-1.37}"
hack/dev-stack.sh up
# shellcheck disable=SC1091
source .dev/env
if [ "${LETHE_DEMO_KEEP:-}" != 1 ]; then
	trap 'hack/dev-stack.sh down' EXIT
fi

# Everything the demo runs is built first: nothing below needs the Go
# toolchain or the module cache.
log "building the manager, the kubectl plugin and the demo's seeder"
for cmd in cmd/manager cmd/kubectl-erasure hack/demo-seed; do
	go build -o "$LOCALBIN/$(basename "$cmd")" "./$cmd"
done
export PATH="$LOCALBIN:$PATH" # `kubectl erasure` finds the plugin on the PATH
# The manager creates its receipt signing key in lethe-system (as on a
# cluster: receipts are signed by default).
kubectl get namespace lethe-system >/dev/null 2>&1 || kubectl create namespace lethe-system >/dev/null
"$LOCALBIN/manager" --kubeconfig "$KUBECONFIG" --metrics-bind-address 0 --health-probe-bind-address 127.0.0.1:0 \
	--store-recheck-interval 30s --receipt-key-secret lethe-system/lethe-receipt-key --record-key-secret lethe-system/lethe-erasure-record-key >.dev/manager.log 2>&1 &
echo $! >.dev/manager.pid

ns=lethe-demo
kubectl get namespace "$ns" >/dev/null 2>&1 || kubectl create namespace "$ns" >/dev/null
# Credentials live only in Secrets in the store's own namespace.
kubectl -n "$ns" create secret generic memory-postgres --from-literal=dsn="$LETHE_PG_DSN" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n "$ns" create secret generic memory-falkordb --from-literal=url="$LETHE_FALKORDB_URL" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# The sample store, without a tenant filter: the demo database has one tenant.
sed '/tenantID:/d' config/samples/erasure_v1alpha1_memorystore.yaml | kubectl -n "$ns" apply -f -

log "waiting for the MemoryStore to become Ready"
if ! kubectl -n "$ns" wait memorystore/memory --for=condition=Ready --timeout=120s >/dev/null; then
	kubectl -n "$ns" get memorystore memory -o yaml >&2
	tail -n 50 .dev/manager.log >&2
	die "the sample MemoryStore did not become Ready"
fi

echo
echo "\$ kubectl -n $ns get memorystores"
kubectl -n "$ns" get memorystores
echo
echo "\$ kubectl -n $ns get memorystore memory -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}){\"\\n\"}{end}'"
kubectl -n "$ns" get memorystore memory -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}){"\n"}{end}'
echo
echo "Schema audit: cascading tables and vector columns"
kubectl -n "$ns" get memorystore memory -o jsonpath='{.status.schema.cascadingTables}{"\n"}{.status.schema.vectorColumns}{"\n"}'

# --- erasure ---------------------------------------------------------------
log "seeding synthetic sessions (rounds, facts, embeddings, a shared cache entry, a derived profile) and deriving their graph"
"$LOCALBIN/demo-seed"
# Velero (a real server, started with the dev stack) backs up the memory
# system before the erasure: a stand-in for its data volume lives in the
# store's namespace; another application's backup is taken beside it.
kubectl get namespace billing >/dev/null 2>&1 || kubectl create namespace billing >/dev/null
kubectl -n "$ns" create configmap memory-volume-stand-in --from-literal=note="stand-in for the memory database's volume" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n billing create configmap billing-volume-stand-in --from-literal=note="another application's data" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
log "Velero takes the nightly backups"
for b in "memory-nightly:memory:$ns" "billing-nightly:billing:billing"; do
	IFS=: read -r name app from <<<"$b"
	cat <<YAML | kubectl -n velero apply -f - >/dev/null
apiVersion: velero.io/v1
kind: Backup
metadata:
  name: $name
  labels: {app.kubernetes.io/part-of: $app}
spec: {includedNamespaces: [$from], ttl: 720h0m0s, storageLocation: default, snapshotVolumes: false}
YAML
	kubectl -n velero wait "backup/$name" --for=jsonpath='{.status.phase}'=Completed --timeout=120s >/dev/null ||
		{ kubectl -n velero get backup "$name" -o yaml >&2; tail -n 30 .dev/stack.log >&2; die "Velero did not complete backup $name"; }
done
echo
echo "\$ kubectl -n velero get backups -o custom-columns=NAME:.metadata.name,PHASE:.status.phase,STARTED:.status.startTimestamp,EXPIRES:.status.expiration"
kubectl -n velero get backups -o custom-columns=NAME:.metadata.name,PHASE:.status.phase,STARTED:.status.startTimestamp,EXPIRES:.status.expiration
echo "Files of memory-nightly in Velero's bucket (the object store's S3 API):"
"$LOCALBIN/demo-seed" -backup-files memory-nightly
psql_counts() {
	psql "$LETHE_PG_DSN" -Atc "SELECT 'sessions=' || (SELECT count(*) FROM memory.sessions) || ' rounds=' || (SELECT count(*) FROM memory.rounds)
		|| ' facts=' || (SELECT count(*) FROM memory.facts) || ' cache=' || (SELECT count(*) FROM memory_derived.embedding_cache)
		|| ' profiles=' || (SELECT count(*) FROM memory_derived.profiles)"
}
echo
echo "memory database before: $(psql_counts)"
echo "knowledge graph before: $("$LOCALBIN/demo-seed" -graph-counts)"
cat <<YAML | kubectl -n "$ns" apply -f -
apiVersion: erasure.lethe.dev/v1alpha1
kind: ErasureRequest
metadata:
  name: forget-immediate
spec:
  storeRef: {name: memory}
  sessionIDs: [0d3c6f7e-1a2b-4c5d-8e9f-000000000001, 0d3c6f7e-1a2b-4c5d-8e9f-000000000002, 6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f]
  immediate: true
  reason: "demo: deadline-bound request DPO-1142"
---
apiVersion: erasure.lethe.dev/v1alpha1
kind: ErasureRequest
metadata:
  name: forget-with-grace
spec:
  storeRef: {name: memory}
  sessionIDs: [0d3c6f7e-1a2b-4c5d-8e9f-000000000004]
  gracePeriod: 168h
YAML
# The store has deleteOnImmediate: Lethe asks Velero, with a
# DeleteBackupRequest, to delete memory-nightly (taken before the deletion);
# Velero deletes the backup's files, then the Backup, then its request.
log "waiting for forget-immediate: Postgres, the graph, then Velero deleting memory-nightly"
kubectl -n "$ns" wait erasurerequest/forget-immediate --for=jsonpath='{.status.phase}'=BackupsRotated --timeout=120s >/dev/null ||
	{ kubectl -n "$ns" get erasurerequest forget-immediate -o yaml >&2; die "forget-immediate did not complete"; }
kubectl -n "$ns" wait erasurerequest/forget-with-grace --for=jsonpath='{.status.phase}'=Tombstoned --timeout=60s >/dev/null ||
	{ kubectl -n "$ns" get erasurerequest forget-with-grace -o yaml >&2; die "forget-with-grace was not tombstoned"; }
echo "memory database after:  $(psql_counts)"
echo "knowledge graph after:  $("$LOCALBIN/demo-seed" -graph-counts)"
echo "  (Orion and Lyra stay: sessions three and four still mention them; Vega and Draco, named only by the erased sessions, are gone)"
echo
echo "\$ kubectl -n velero get backups,deletebackuprequests"
kubectl -n velero get backups,deletebackuprequests -o custom-columns=KIND:.kind,NAME:.metadata.name,PHASE:.status.phase
echo "Files of memory-nightly left in Velero's bucket:"
"$LOCALBIN/demo-seed" -backup-files memory-nightly
echo "Files of billing-nightly (another application's, untouched):"
"$LOCALBIN/demo-seed" -backup-files billing-nightly | tail -n 1
left=$("$LOCALBIN/demo-seed" -backup-files memory-nightly | tail -n 1 | awk '{print $1}')
[ "$left" = 0 ] || die "Velero's bucket still holds $left file(s) of memory-nightly"
echo
echo "\$ kubectl -n $ns get erasurerequests"
kubectl -n "$ns" get erasurerequests
for r in forget-immediate forget-with-grace; do
	echo
	echo "History of $r (a hash chain; each entry names the digest of the one before):"
	kubectl -n "$ns" get erasurerequest "$r" -o jsonpath='{range .status.history[*]}  {.time}  {.phase}{" "}{.event}{"\n"}    evidence {.evidenceDigest}{"\n"}    digest   {.digest}{"\n"}{end}'
	echo "  plan: $(kubectl -n "$ns" get erasurerequest "$r" -o jsonpath='{.status.plan.sessionsFound} found, not found: {.status.plan.notFoundSessionIDs}, embeddings {.status.plan.embeddings}, cache entries {.status.plan.contentIndexEntries}, derived records {.status.plan.derivedRecords}')"
	echo "  graph step evidence:"
	kubectl -n "$ns" get erasurerequest "$r" -o jsonpath='{range .status.evidence.steps[?(@.step=="GraphReconciled")]}{range .counts[*]}    removed {.table}: {.rows}{"\n"}{end}{range .verification[*]}    verified {.check}: {.found} found{"\n"}{end}    {.note}{"\n"}{end}'
	echo "  backup step evidence:"
	kubectl -n "$ns" get erasurerequest "$r" -o jsonpath='{range .status.evidence.steps[?(@.step=="BackupsRotated")]}{range .backups[*]}    {.name}: started {.startedAt}, would have expired {.originalExpiration}, DeleteBackupRequest {.deleteBackupRequest}, gone {.goneAt}{"\n"}{end}{end}'
	echo "  conditions:"
	kubectl -n "$ns" get erasurerequest "$r" -o jsonpath='{range .status.conditions[*]}    {.type}={.status} ({.reason}){"\n"}{end}'
done

# The receipt enters the store's receipt log on the pass after the one
# that issued it (only what the API server holds is mirrored).
for _ in $(seq 1 60); do
	[ -n "$(kubectl -n "$ns" get erasurerequest forget-immediate -o jsonpath='{.status.receipt.log.checkpoint}')" ] && break
	sleep 1
done
echo
echo "What an auditor runs (the kubectl plugin):"
echo "\$ kubectl erasure history forget-immediate -n $ns"
kubectl erasure history forget-immediate -n "$ns"
echo
echo "\$ kubectl erasure verify forget-immediate -n $ns"
kubectl erasure verify forget-immediate -n "$ns"

echo
echo "The proof outlives the cluster. The auditor exports a bundle, keeps the published"
echo "key set and a checkpoint of the store's receipt log, and verifies with no cluster:"
echo "\$ kubectl erasure export forget-immediate -n $ns > .dev/forget-immediate.bundle.json"
kubectl erasure export forget-immediate -n "$ns" >.dev/forget-immediate.bundle.json
kubectl -n lethe-system get configmap lethe-receipt-key -o jsonpath='{.data.keyset\.json}' >.dev/keyset.json
echo "\$ kubectl erasure receipts --store memory -n $ns --save-checkpoint .dev/receipts.checkpoint"
kubectl erasure receipts --store memory -n "$ns" --save-checkpoint .dev/receipts.checkpoint
if [ "${LETHE_DEMO_KEEP:-}" != 1 ]; then
	echo
	echo "Stopping the manager and the API server: what follows needs no cluster."
	hack/dev-stack.sh down
fi
# A kubeconfig naming no reachable cluster: the commands below never use it.
cat >.dev/no-cluster.kubeconfig <<'KUBECONFIG'
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
KUBECONFIG
echo "\$ kubectl erasure verify --bundle .dev/forget-immediate.bundle.json --key-set .dev/keyset.json"
kubectl erasure verify --bundle .dev/forget-immediate.bundle.json --key-set .dev/keyset.json --kubeconfig .dev/no-cluster.kubeconfig
echo "\$ kubectl erasure report --bundle .dev/forget-immediate.bundle.json --key-set .dev/keyset.json > .dev/certificate-forget-immediate.html"
kubectl erasure report --bundle .dev/forget-immediate.bundle.json --key-set .dev/keyset.json --kubeconfig .dev/no-cluster.kubeconfig >.dev/certificate-forget-immediate.html
echo "certificate of erasure: $(pwd)/.dev/certificate-forget-immediate.html ($(wc -c <.dev/certificate-forget-immediate.html) bytes; open it in a browser)"

if [ "${LETHE_DEMO_KEEP:-}" = 1 ]; then
	echo
	log "the stack stays up: '. .dev/env' to use it, 'make dev-down' to stop it"
fi
