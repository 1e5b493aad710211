#!/usr/bin/env bash
# Installs Valkey (a Redis >= 7.2 server, from bookworm-backports) and the
# FalkorDB module (the falkordb.so shipped in an npm package). Debian's own
# redis-server 7.0 is too old for FalkorDB; the redis-server inside the npm
# package needs a newer glibc. The module is cached per version under
# $LETHE_CACHE and linked into bin/falkordb.so.
#   FALKORDB_NPM=@falkordblite/linux-x64@8.2.3-falkordb.4.16.3 FALKORDB_SHA256=... hack/install-falkordb.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_var FALKORDB_NPM falkordb
require_var FALKORDB_SHA256 falkordb

if ! command -v valkey-server >/dev/null 2>&1; then
	log "installing valkey-server from bookworm-backports (under a minute)"
	list=/etc/apt/sources.list.d/lethe-bookworm-backports.list
	if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
		echo "deb http://deb.debian.org/debian bookworm-backports main" >"$list"
	fi
	apt_install -t bookworm-backports valkey-server libgomp1
	# The package starts a system-wide service; tests start their own servers.
	if command -v systemctl >/dev/null 2>&1; then systemctl disable --now valkey-server >/dev/null 2>&1 || true; fi
fi
# grep -q would exit at the first match and, under pipefail, ldconfig's
# SIGPIPE would read as "missing" (and run apt-get on every start).
if ! ldconfig -p | grep libgomp.so.1 >/dev/null; then apt_install libgomp1; fi

ver="${FALKORDB_NPM##*@}"
dest="$LETHE_CACHE/falkordb-$ver"
if [ ! -f "$dest/falkordb.so" ]; then
	log "fetching the FalkorDB module $FALKORDB_NPM from the npm registry (seconds)"
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	(cd "$work" && npm pack --silent "$FALKORDB_NPM" >/dev/null)
	tar -xzf "$work"/*.tgz -C "$work"
	got=$(sha256sum "$work/package/bin/falkordb.so" | cut -d' ' -f1)
	[ "$got" = "$FALKORDB_SHA256" ] || die "falkordb.so checksum mismatch: got $got, want $FALKORDB_SHA256"
	mkdir -p "$dest"
	cp "$work/package/bin/falkordb.so" "$dest/falkordb.so.tmp"
	mv "$dest/falkordb.so.tmp" "$dest/falkordb.so"
	rm -rf "$work"; trap - EXIT
fi
link_into_bin "$dest/falkordb.so" falkordb.so
