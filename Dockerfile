# The manager's image: a static binary on a distroless, non-root base.
# `make image` builds it (docker, podman or buildah), for several platforms
# with IMAGE_PLATFORMS=linux/amd64,linux/arm64: the Go compiler runs on the
# build machine's platform (BUILDPLATFORM) and cross-compiles for each
# TARGETOS/TARGETARCH, so no emulation is needed.
FROM --platform=$BUILDPLATFORM golang:1.26.8 AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=dev
ARG GIT_COMMIT=unknown
ARG BUILD_DATE=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
COPY migrations/ migrations/
# The same flags and version stamps as `make release` (hack/release.sh).
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
    -ldflags="-s -w -X github.com/lethe-dev/lethe/internal/version.Version=${VERSION} -X github.com/lethe-dev/lethe/internal/version.GitCommit=${GIT_COMMIT} -X github.com/lethe-dev/lethe/internal/version.BuildDate=${BUILD_DATE}" \
    -o /out/manager ./cmd/manager

FROM gcr.io/distroless/static:nonroot
ARG VERSION=dev
ARG GIT_COMMIT=unknown
ARG BUILD_DATE=unknown
LABEL org.opencontainers.image.title="lethe-manager" \
      org.opencontainers.image.description="Lethe: a Kubernetes operator that carries out GDPR right-to-erasure requests against an LLM memory system (PostgreSQL + pgvector, FalkorDB, Velero backups)" \
      org.opencontainers.image.url="https://github.com/lethe-dev/lethe" \
      org.opencontainers.image.source="https://github.com/lethe-dev/lethe" \
      org.opencontainers.image.documentation="https://github.com/lethe-dev/lethe#readme" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="Lethe" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_COMMIT}" \
      org.opencontainers.image.created="${BUILD_DATE}"
COPY LICENSE /licenses/LICENSE
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
