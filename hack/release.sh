#!/usr/bin/env bash
# release.sh: build Lethe's release artifacts into $DIST, offline; nothing is
# published. Run through the Makefile (`make release`, `make image`), which
# pins the tools and sets the variables below.
#
#   hack/release.sh         binaries (kubectl-erasure, manager) for each of
#                           RELEASE_PLATFORMS, tar.gz archives with LICENSE and
#                           README.md, a CycloneDX SBOM each, the packaged Helm chart,
#                           the krew plugin manifest, and checksums.txt (sha256)
#   hack/release.sh image   the manager's container image with the Dockerfile,
#                           where docker, podman or buildah is installed
#   hack/release.sh versions  the release's and the chart's version
#
# VERSION            default: git describe --tags --always --dirty
# RELEASE_PLATFORMS  default: linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
# RELEASE_URL        where the archives will be downloaded from (krew manifest)
# DIST               output folder, default dist/ (emptied first)
# IMG, IMAGE_PLATFORMS, CONTAINER_ENGINE   for `image`
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

MODULE=github.com/lethe-dev/lethe
VERSION=${VERSION:-$(git describe --tags --always --dirty)}
GIT_COMMIT=${GIT_COMMIT:-$(git rev-parse HEAD)}
# The build date is the commit's (or SOURCE_DATE_EPOCH): the same commit
# builds the same archives, byte for byte.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct HEAD)}
BUILD_DATE=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
RELEASE_PLATFORMS=${RELEASE_PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}
RELEASE_URL=${RELEASE_URL:-https://github.com/lethe-dev/lethe/releases/download/$VERSION}
DIST=${DIST:-$REPO_ROOT/dist}

[[ $VERSION =~ ^[0-9A-Za-z][0-9A-Za-z._+-]*$ ]] || die "VERSION '$VERSION' is not a version (letters, digits, . _ + -)"

# The chart and krew want semantic versions: a tag (v1.2.3) gives 1.2.3;
# anything else (an untagged commit) a pre-release of the chart's own version.
semver() {
	if [[ $VERSION =~ ^v?([0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?)$ ]]; then
		echo "${BASH_REMATCH[1]}"
	else
		local base
		base=$(sed -n 's/^version: *//p' charts/lethe/Chart.yaml)
		echo "${base%%-*}-dev.${VERSION//[^0-9A-Za-z-]/-}"
	fi
}

ldflags() {
	echo "-s -w -X $MODULE/internal/version.Version=$VERSION -X $MODULE/internal/version.GitCommit=$GIT_COMMIT -X $MODULE/internal/version.BuildDate=$BUILD_DATE"
}

tool() { # tool NAME VAR TARGET: the path of a pinned tool, or a clear stop
	local path=${!2:-$LOCALBIN/$1}
	[ -x "$path" ] || die "$1 is not installed at $path: run 'make $3' (make release does)"
	echo "$path"
}

image() {
	local engine=${CONTAINER_ENGINE:-} e
	if [ -z "$engine" ]; then
		for e in docker podman buildah; do
			if command -v "$e" >/dev/null 2>&1; then engine=$e && break; fi
		done
	fi
	if [ -z "$engine" ] || ! command -v "$engine" >/dev/null 2>&1; then
		die "make image needs a container engine (docker, podman or buildah; or CONTAINER_ENGINE=...), and none is installed here. No image was built. 'make release' builds the binaries, the chart and the SBOMs without one."
	fi
	local img=${IMG:-ghcr.io/lethe-dev/lethe:$VERSION}
	local platforms=${IMAGE_PLATFORMS:-linux/$(go env GOARCH)}
	local args=(--build-arg "VERSION=$VERSION" --build-arg "GIT_COMMIT=$GIT_COMMIT" --build-arg "BUILD_DATE=$BUILD_DATE"
		--platform "$platforms" -f Dockerfile)
	log "building $img for $platforms with $engine"
	case "$engine:$platforms" in
	*docker:*,*) "$engine" buildx build "${args[@]}" -t "$img" . ;; # a multi-arch list: buildx (add --push to publish)
	*docker:*) "$engine" build "${args[@]}" -t "$img" . ;;
	*:*,*) "$engine" build "${args[@]}" --manifest "$img" . ;; # podman/buildah: a manifest list
	*) "$engine" build "${args[@]}" -t "$img" . ;;
	esac
}

# archive NAME OS ARCH: dist/NAME_VERSION_OS_ARCH.tar.gz with the binary,
# LICENSE and README.md, reproducible (sorted, fixed owner and time, no gzip
# timestamp).
archive() {
	local name=$1 os=$2 arch=$3 stage
	stage="$DIST/.stage/${name}_${os}_${arch}"
	mkdir -p "$stage"
	cp LICENSE README.md "$stage/"
	mv "$DIST/.bin/${name}_${os}_${arch}" "$stage/$name"
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" -C "$stage" -cf - "$name" LICENSE README.md |
		gzip -n -9 >"$DIST/${name}_${VERSION}_${os}_${arch}.tar.gz"
}

# krew_manifest: config/krew/erasure.yaml with the version and one platform
# entry (uri, sha256) per plugin archive.
krew_manifest() {
	local platforms="" p os arch file sum
	for p in $RELEASE_PLATFORMS; do
		os=${p%/*} arch=${p#*/}
		file="kubectl-erasure_${VERSION}_${os}_${arch}.tar.gz"
		sum=$(sha256sum "$DIST/$file" | cut -d' ' -f1)
		platforms+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $RELEASE_URL/$file
    sha256: $sum
    bin: kubectl-erasure
    files:
      - from: kubectl-erasure
        to: .
      - from: LICENSE
        to: .
"
	done
	mkdir -p "$DIST/krew"
	awk -v version="v$(semver)" -v platforms="$platforms" '
		/^ *# / && !started { next }
		{ started = 1 }
		/\{\{PLATFORMS\}\}/ { printf "%s", platforms; next }
		{ gsub(/\{\{VERSION\}\}/, version); print }' config/krew/erasure.yaml >"$DIST/krew/erasure.yaml"
}

release() {
	local helm cdx p os arch name
	helm=$(tool helm LETHE_HELM helm)
	cdx=$(tool cyclonedx-gomod CYCLONEDX_GOMOD cyclonedx-gomod)
	[ -f LICENSE ] || die "LICENSE is missing: every archive ships it"
	log "release $VERSION (chart $(semver), commit $GIT_COMMIT, built $BUILD_DATE) into $DIST for: $RELEASE_PLATFORMS"
	rm -rf "$DIST"
	mkdir -p "$DIST/.bin"
	for p in $RELEASE_PLATFORMS; do
		os=${p%/*} arch=${p#*/}
		case "$os/$arch" in linux/amd64 | linux/arm64 | darwin/amd64 | darwin/arm64) ;; *) die "unsupported platform $p (RELEASE_PLATFORMS)" ;; esac
		for name in kubectl-erasure manager; do
			log "build $name $os/$arch"
			CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "$(ldflags)" \
				-o "$DIST/.bin/${name}_${os}_${arch}" "./cmd/$name"
			archive "$name" "$os" "$arch"
			# Its SBOM: the modules linked into this binary for this platform
			# (build constraints select them) and the Go standard library, with
			# the licences detected; no serial or timestamp, so it is reproducible.
			CGO_ENABLED=0 GOOS=$os GOARCH=$arch "$cdx" app -json -licenses -std -noserial -notimestamp -main "cmd/$name" \
				-output "$DIST/${name}_${VERSION}_${os}_${arch}.cdx.json" . 2>"$DIST/.sbom.log" ||
				{ cat "$DIST/.sbom.log" >&2; die "cyclonedx-gomod failed for $name $os/$arch"; }
		done
	done
	rm -rf "$DIST/.bin" "$DIST/.stage" "$DIST/.sbom.log"

	# The chart, its app version and the image Artifact Hub lists being this release's.
	log "chart"
	mkdir -p "$DIST/.chart"
	cp -R charts/lethe "$DIST/.chart/"
	sed -i "s|image: ghcr.io/lethe-dev/lethe:.*|image: ghcr.io/lethe-dev/lethe:$VERSION|" "$DIST/.chart/lethe/Chart.yaml"
	"$helm" package "$DIST/.chart/lethe" --version "$(semver)" --app-version "$VERSION" -d "$DIST" >/dev/null
	rm -rf "$DIST/.chart"

	log "krew manifest"
	krew_manifest

	(cd "$DIST" && find . -type f ! -name checksums.txt | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >checksums.txt)
	log "done: $(find "$DIST" -type f | wc -l) files in $DIST"
}

case "${1:-release}" in
release) release ;;
image) image ;;
versions) echo "$VERSION $(semver)" ;; # the release's and the chart's version (tests)
*) die "usage: $0 [release|image|versions]" ;;
esac
