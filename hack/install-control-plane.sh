#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver and etcd) from the Go module
# proxy, since no release archive can be downloaded here. Cached per version in
# $LETHE_CACHE/k8s-<ver>-etcd-<ver>/; bin/k8s links to it.
#   KUBE_VERSION=1.37.2 ETCD_VERSION=3.6.16 hack/install-control-plane.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_var KUBE_VERSION envtest-assets
require_var ETCD_VERSION envtest-assets

dest="$LETHE_CACHE/k8s-$KUBE_VERSION-etcd-$ETCD_VERSION"
mkdir -p "$dest"
minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
staging="0.$minor.$(echo "$KUBE_VERSION" | cut -d. -f3)"

if [ ! -x "$dest/kube-apiserver" ]; then
	log "building kube-apiserver v$KUBE_VERSION from Go modules: about 10 minutes (up to 15 on a busy machine) and ~3 GB of Go build cache on 2 cores, once per machine"
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	gomod=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	[ -f "$gomod" ] || die "could not fetch k8s.io/kubernetes@v$KUBE_VERSION go.mod"
	{
		echo "module lethe.dev/build/kube-apiserver"
		echo "go 1.26"
		echo "require k8s.io/kubernetes v$KUBE_VERSION"
		# Every staging module the kubernetes go.mod points at ./staging is
		# served by the proxy at the matching v0.x version.
		grep -E '^\s*k8s.io/[a-z0-9-]+ => ./staging' "$gomod" | awk -v v="v$staging" '{print "replace " $1 " => " $1 " " v}'
	} >"$work/go.mod"
	printf '//go:build tools\npackage tools\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >"$work/tools.go"
	(cd "$work" && go mod tidy >&2 && go build -o "$dest/kube-apiserver.tmp" \
		-ldflags "-X k8s.io/component-base/version.gitVersion=v$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
		k8s.io/kubernetes/cmd/kube-apiserver)
	mv "$dest/kube-apiserver.tmp" "$dest/kube-apiserver"
	rm -rf "$work"; trap - EXIT
	log "kube-apiserver built"
fi

if [ ! -x "$dest/etcd" ]; then
	log "building etcd v$ETCD_VERSION from Go modules: about a minute, once per machine"
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	{
		echo "module lethe.dev/build/etcd"
		echo "go 1.26"
		for m in server/v3 api/v3 client/pkg/v3 client/v3 pkg/v3; do
			echo "require go.etcd.io/etcd/$m v$ETCD_VERSION"
		done
	} >"$work/go.mod"
	printf '//go:build tools\npackage tools\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$work/tools.go"
	(cd "$work" && go mod tidy >&2 && go build -o "$dest/etcd.tmp" go.etcd.io/etcd/server/v3)
	mv "$dest/etcd.tmp" "$dest/etcd"
	rm -rf "$work"; trap - EXIT
	log "etcd built"
fi

# kubectl comes with the machine; envtest only needs the two servers, but a
# kubectl beside them lets KUBEBUILDER_ASSETS serve both.
if command -v kubectl >/dev/null 2>&1 && [ ! -e "$dest/kubectl" ]; then
	ln -sfn "$(command -v kubectl)" "$dest/kubectl"
fi
link_into_bin "$dest" k8s
echo "$dest"
