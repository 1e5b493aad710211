#!/usr/bin/env bash
# Installs real Velero for the tests and the dev stack, each built from Go
# modules and cached per user, keyed by version:
#   - the Velero server (VELERO_VERSION), unmodified;
#   - the AWS object-store plugin (VELERO_AWS_PLUGIN_VERSION);
#   - gofakes3 (GOFAKES3_VERSION), an S3-compatible server.
# Each module's source is checked against its pinned go.sum hash (h1:) before
# it is built. Links bin/velero, bin/velero-plugin-for-aws and bin/gofakes3.
#   VELERO_VERSION=v1.18.1 ... hack/install-velero.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
for v in VELERO_VERSION VELERO_SUM VELERO_AWS_PLUGIN_VERSION VELERO_AWS_PLUGIN_SUM GOFAKES3_VERSION GOFAKES3_SUM; do
	require_var "$v" velero
done

# module_dir MODULE VERSION SUM downloads a module into the module cache,
# checks its hash and prints its directory.
module_dir() {
	local mod=$1 ver=$2 want=$3 out got dir
	out=$(GOFLAGS=-mod=mod go mod download -json "$mod@$ver") || die "cannot download $mod@$ver: $out"
	got=$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",\{0,1\}$/\1/p' <<<"$out")
	dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$out")
	[ "$got" = "$want" ] || die "$mod@$ver checksum mismatch: got $got, want $want"
	[ -d "$dir" ] || die "$mod@$ver: no source directory in the module cache"
	printf '%s\n' "$dir"
}

# Velero's go.mod replaces kopia, so `go install module@version` refuses it:
# build its source as the main module in a scratch folder. Two of the
# Kubernetes modules it requires are not served here; the nearest patch
# releases are (API-compatible within v0.33).
dest="$LETHE_CACHE/velero-$VELERO_VERSION"
if [ ! -x "$dest/velero" ]; then
	log "building velero $VELERO_VERSION from its module (about 5 minutes on 2 cores, once per machine)"
	src=$(module_dir github.com/vmware-tanzu/velero "$VELERO_VERSION" "$VELERO_SUM")
	work=$(mktemp -d)
	trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
	cp -r "$src" "$work/velero"
	chmod -R u+w "$work/velero"
	(
		cd "$work/velero"
		go mod edit -replace k8s.io/kube-aggregator=k8s.io/kube-aggregator@v0.33.13 \
			-replace k8s.io/cli-runtime=k8s.io/cli-runtime@v0.33.13
		GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0 go build -trimpath -o "$work/velero.bin" ./cmd/velero
	)
	mkdir -p "$dest"
	mv "$work/velero.bin" "$dest/velero"
	chmod -R u+w "$work"; rm -rf "$work"; trap - EXIT
fi
link_into_bin "$dest/velero" velero

dest="$LETHE_CACHE/velero-plugin-for-aws-$VELERO_AWS_PLUGIN_VERSION"
if [ ! -x "$dest/velero-plugin-for-aws" ]; then
	log "building velero-plugin-for-aws $VELERO_AWS_PLUGIN_VERSION (about 4 minutes, once per machine)"
	module_dir github.com/vmware-tanzu/velero-plugin-for-aws "$VELERO_AWS_PLUGIN_VERSION" "$VELERO_AWS_PLUGIN_SUM" >/dev/null
	GOBIN="$dest" GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath \
		"github.com/vmware-tanzu/velero-plugin-for-aws/velero-plugin-for-aws@$VELERO_AWS_PLUGIN_VERSION"
fi
link_into_bin "$dest/velero-plugin-for-aws" velero-plugin-for-aws

dest="$LETHE_CACHE/gofakes3-$GOFAKES3_VERSION"
if [ ! -x "$dest/gofakes3" ]; then
	log "building gofakes3 $GOFAKES3_VERSION (seconds, once per machine)"
	module_dir github.com/johannesboyne/gofakes3 "$GOFAKES3_VERSION" "$GOFAKES3_SUM" >/dev/null
	GOBIN="$dest" GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath "github.com/johannesboyne/gofakes3/cmd/gofakes3@$GOFAKES3_VERSION"
fi
link_into_bin "$dest/gofakes3" gofakes3
