#!/usr/bin/env bash
# hack/demo.sh — Lethe on the local dev stack: starts the manager, creates the
# sample MemoryStore (Postgres with the reference schema, FalkorDB, Velero),
# waits for it to be Ready and shows it with kubectl.
#
# The dev stack and the manager are stopped at the end; LETHE_DEMO_KEEP=1
# leaves them running (stop them with `make dev-down`).
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/lib.sh

hack/dev-stack.sh up
# shellcheck disable=SC1091
source .dev/env
if [ "${LETHE_DEMO_KEEP:-}" != 1 ]; then
	trap 'hack/dev-stack.sh down' EXIT
fi

log "building and starting the manager"
go build -o "$LOCALBIN/manager" ./cmd/manager
"$LOCALBIN/manager" --kubeconfig "$KUBECONFIG" --metrics-bind-address 0 --health-probe-bind-address 127.0.0.1:0 \
	--store-recheck-interval 30s >.dev/manager.log 2>&1 &
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
if [ "${LETHE_DEMO_KEEP:-}" = 1 ]; then
	echo
	log "the stack stays up: '. .dev/env' to use it, 'make dev-down' to stop it"
fi
