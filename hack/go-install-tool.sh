#!/usr/bin/env bash
# go-install-tool.sh NAME PACKAGE VERSION: go install a pinned tool into the
# per-user cache and link it into ./bin.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
name=$1 pkg=$2 ver=$3
dest="$LETHE_CACHE/$name-$ver"
if [ ! -x "$dest/$name" ]; then
	log "installing $name $ver (once per machine)"
	GOBIN="$dest" GOFLAGS=-mod=mod go install "$pkg@$ver"
fi
link_into_bin "$dest/$name" "$name"
