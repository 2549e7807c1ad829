# Images of cce-ipam (the replica, with the operator CLI ipamctl beside it) and
# bce-sim (the BCE OpenAPI simulator, for kind e2e), built without pulling any
# image: `make image` builds static binaries (CGO_ENABLED=0, -trimpath) on the
# host into bin/image/ together with the host's CA bundle, and this file only
# copies them onto an empty filesystem. So it works where no registry is
# reachable, and the images hold nothing but what they run. The replica calls
# the BCE OpenAPI over HTTPS: hence the CA bundle. It runs as the non-root user
# 65532 (numeric: there is no /etc/passwd to look a name up in); the chart
# gives it a read-only root filesystem.
#
#   make image                                  (both images; IMAGE=..., IMAGE_SIM=...)
#   docker build --target cce-ipam -t cce-ipam:dev bin/image    (after make image-context)

FROM scratch AS bce-sim
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY bce-sim /bce-sim
USER 65532:65532
ENTRYPOINT ["/bce-sim"]

# The last stage is the default target: a plain `docker build` gives cce-ipam.
FROM scratch AS cce-ipam
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY cce-ipam ipamctl /
USER 65532:65532
# gRPC (CNI), metrics/health, memberlist gossip (TCP and UDP).
EXPOSE 9997 9998 7946 7946/udp
ENTRYPOINT ["/cce-ipam"]
