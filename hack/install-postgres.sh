#!/usr/bin/env bash
# Installs PostgreSQL 15 (Debian bookworm) and builds pgvector from Debian
# trixie's source package against it (bookworm has no pgvector package).
# Idempotent: does nothing when the server and vector.so are already there.
#   PG_MAJOR=15 PGVECTOR_VERSION=0.8.0 hack/install-postgres.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_var PG_MAJOR postgres
require_var PGVECTOR_VERSION postgres

pgbin="/usr/lib/postgresql/$PG_MAJOR/bin"
if [ ! -x "$pgbin/postgres" ] || [ ! -x "$pgbin/pg_config" ] || ! id postgres >/dev/null 2>&1 ||
	[ ! -f "$("$pgbin/pg_config" --includedir-server)/postgres.h" ]; then
	log "installing postgresql-$PG_MAJOR and its server headers from Debian (about a minute)"
	apt_install "postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR" build-essential dpkg-dev
fi

sharedir=$("$pgbin/pg_config" --sharedir)
pkglibdir=$("$pgbin/pg_config" --pkglibdir)
if [ -f "$pkglibdir/vector.so" ] && grep -q "default_version = '$PGVECTOR_VERSION'" "$sharedir/extension/vector.control" 2>/dev/null; then
	exit 0
fi

src="$LETHE_CACHE/pgvector-$PGVECTOR_VERSION"
if [ ! -f "$src/Makefile" ]; then
	log "fetching pgvector $PGVECTOR_VERSION source from Debian trixie (seconds)"
	command -v dpkg-source >/dev/null || apt_install dpkg-dev
	aptdir=$(mktemp -d)
	trap 'rm -rf "$aptdir"' EXIT
	# A private sources list keeps the machine's binary sources on bookworm.
	echo "deb-src http://deb.debian.org/debian trixie main" >"$aptdir/sources.list"
	mkdir -p "$aptdir/lists/partial" "$aptdir/archives/partial"
	aptopts=(-o "Dir::Etc::SourceList=$aptdir/sources.list" -o "Dir::Etc::SourceParts=-" -o "Dir::State::Lists=$aptdir/lists" -o "APT::Get::List-Cleanup=0")
	apt-get "${aptopts[@]}" update -qq >&2
	(cd "$aptdir" && apt-get "${aptopts[@]}" -o APT::Sandbox::User=root source --download-only -qq pgvector >&2)
	orig=$(ls "$aptdir"/pgvector_"$PGVECTOR_VERSION".orig.tar.* 2>/dev/null | head -n1)
	[ -n "$orig" ] || die "Debian trixie did not serve pgvector $PGVECTOR_VERSION (got: $(ls "$aptdir"))"
	mkdir -p "$src"
	tar -xf "$orig" -C "$src" --strip-components=1
	rm -rf "$aptdir"; trap - EXIT
fi

log "building pgvector $PGVECTOR_VERSION against PostgreSQL $PG_MAJOR (about 20 seconds)"
# OPTFLAGS="" avoids -march=native, so the build runs on any x86_64 machine.
make -s -C "$src" OPTFLAGS="" PG_CONFIG="$pgbin/pg_config" clean >/dev/null 2>&1 || true
make -s -C "$src" OPTFLAGS="" PG_CONFIG="$pgbin/pg_config" >&2
make -s -C "$src" OPTFLAGS="" PG_CONFIG="$pgbin/pg_config" install >&2
log "pgvector installed"
