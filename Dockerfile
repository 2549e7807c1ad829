# syntax=docker/dockerfile:1
# Images of cce-ipam (the replica) and bce-sim (the BCE OpenAPI simulator, for
# kind e2e). Static binaries (CGO_ENABLED=0) on distroless static, as the
# non-root user 65532; the chart runs them with a read-only root filesystem.
#
#   docker build --target cce-ipam -t cce-ipam:dev .      (make image)
#   docker build --target bce-sim  -t cce-ipam-bce-sim:dev .

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
# The version replicas advertise in their gossip meta and User-Agent.
ARG VERSION=dev
# -trimpath and no VCS stamping make the binaries reproducible from the source.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false -ldflags="-s -w -X main.version=${VERSION}" -o /out/ ./cmd/cce-ipam ./cmd/bce-sim

FROM gcr.io/distroless/static-debian12:nonroot AS bce-sim
COPY --from=build /out/bce-sim /bce-sim
USER 65532:65532
ENTRYPOINT ["/bce-sim"]

# The last stage is the default target: a plain `docker build .` gives cce-ipam.
FROM gcr.io/distroless/static-debian12:nonroot AS cce-ipam
COPY --from=build /out/cce-ipam /cce-ipam
USER 65532:65532
# gRPC (CNI), metrics/health, memberlist gossip (TCP and UDP).
EXPOSE 9997 9998 7946 7946/udp
ENTRYPOINT ["/cce-ipam"]
