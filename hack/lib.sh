# Shared helpers for the hack/ scripts. Source it; do not run it.
# Everything expensive is cached per user, keyed by version, so a fresh clone
# (as CI makes) reuses what an earlier run built.

LETHE_CACHE="${LETHE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lethe}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCALBIN="${LOCALBIN:-$REPO_ROOT/bin}"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

require_var() {
	local name=$1
	[ -n "${!name:-}" ] || die "$name is not set; run this through the Makefile (make $2), which pins the versions"
}

# apt_update_once runs apt-get update at most once per script run.
APT_UPDATED=""
apt_update_once() {
	if [ -z "$APT_UPDATED" ]; then
		log "apt-get update (a few seconds)"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq "$@" >&2
		APT_UPDATED=1
	fi
}

apt_install() {
	apt_update_once
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

# link_into_bin makes $LOCALBIN/<name> point at a cached file.
link_into_bin() {
	local src=$1 name=$2
	mkdir -p "$LOCALBIN"
	ln -sfn "$src" "$LOCALBIN/$name"
}
