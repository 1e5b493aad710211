#!/usr/bin/env bash
# hack/dev-stack.sh up|down|status — the local dev stack.
#
#   up      installs what is missing (through make), starts the control plane
#           with the Lethe and Velero CRDs, PostgreSQL with the reference
#           schema migrated, and FalkorDB, then writes .dev/env (KUBECONFIG,
#           LETHE_PG_DSN, LETHE_FALKORDB_URL). Source it: `. .dev/env`.
#   down    stops everything `up` started (by PID).
#   status  says whether the stack is up and prints .dev/env.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/lib.sh
DEV=.dev
PIDFILE=$DEV/stack.pid

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

up() {
	if running && [ -f "$DEV/env" ]; then
		log "dev stack already up (pid $(cat "$PIDFILE")); env in $DEV/env"
		return 0
	fi
	mkdir -p "$DEV"
	rm -f "$DEV/env"
	# First run on a machine: the control plane build takes about 10 minutes;
	# every later run reuses the cache and takes seconds.
	if [ ! -x "$LOCALBIN/k8s/kube-apiserver" ] || [ ! -f "$LOCALBIN/falkordb.so" ]; then
		log "installing the dev stack's services first (cached per machine; the first time takes about 10 minutes)"
	fi
	make --no-print-directory dev-deps
	log "building the dev stack runner"
	go build -o "$LOCALBIN/devstack" ./hack/devstack
	log "starting the dev stack (about 10 seconds)"
	nohup "$LOCALBIN/devstack" --dir "$DEV" >"$DEV/stack.log" 2>&1 &
	echo $! >"$PIDFILE"
	for _ in $(seq 1 600); do
		if [ -f "$DEV/env" ]; then
			log "dev stack up (pid $(cat "$PIDFILE")); source $DEV/env"
			return 0
		fi
		if ! running; then
			cat "$DEV/stack.log" >&2
			rm -f "$PIDFILE"
			die "dev stack failed to start; log above"
		fi
		sleep 0.2
	done
	down
	die "dev stack did not become ready in 2 minutes; see $DEV/stack.log"
}

down() {
	if [ -f "$DEV/manager.pid" ] && kill -0 "$(cat "$DEV/manager.pid")" 2>/dev/null; then
		kill "$(cat "$DEV/manager.pid")" 2>/dev/null || true
		log "stopped the manager (pid $(cat "$DEV/manager.pid"))"
	fi
	rm -f "$DEV/manager.pid"
	if running; then
		pid=$(cat "$PIDFILE")
		kill "$pid"
		for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		if kill -0 "$pid" 2>/dev/null; then
			log "dev stack (pid $pid) did not stop in 30s; sending SIGKILL"
			kill -9 "$pid" 2>/dev/null || true
		fi
		log "dev stack stopped"
	else
		log "dev stack not running"
	fi
	rm -f "$PIDFILE" "$DEV/env"
}

status() {
	if running && [ -f "$DEV/env" ]; then
		log "dev stack up (pid $(cat "$PIDFILE"))"
		cat "$DEV/env"
	else
		log "dev stack not running"
		return 1
	fi
}

case "${1:-}" in
up) up ;;
down) down ;;
status) status ;;
*) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
