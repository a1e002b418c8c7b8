# syntax=docker/dockerfile:1
# fusedserve container image, built in two stages:
#   builder  CUDA devel image: the project's dependency script, then a release
#            build of the fusedserve binary (deploy/build-release.sh)
#   runtime  CUDA runtime image (cudart, cuBLAS/cuBLASLt, NCCL for
#            --tensor_parallel, loaded at run time) plus only the shared
#            libraries the binary loads (deploy/install-runtime-deps.sh, checked
#            against the real binary by deploy/check-runtime-deps.sh)
# Every step is a script in deploy/ that CI runs on its own; only the base
# images are exercised by a real image build alone. Build with
# deploy/build-image.sh (docker, podman or buildah), which stamps the labels.
#
# Run (GPU through the NVIDIA container toolkit):
#   docker run --gpus 1 -p 50051:50051 -p 9090:9090 \
#     -v fusedserve-cache:/var/cache/fusedserve -v /path/to/checkpoint:/models:ro \
#     fusedserve:0.1.0 --model=/models
# Extra arguments are appended to the default flags (a repeated flag: the last wins).

ARG CUDA_VERSION=13.0.0
ARG UBUNTU_VERSION=24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS builder
# Compute capabilities to build for (90: H100/H200; e.g. "80;90" adds A100).
ARG CUDA_ARCHITECTURES=90
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# Dependencies first: this layer is reused until the script changes.
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN deploy/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY CMakeLists.txt CMakePresets.json ./
COPY proto/ proto/
COPY kernels/ kernels/
COPY warmup/ warmup/
COPY tokenizer/ tokenizer/
COPY telemetry/ telemetry/
COPY model/ model/
COPY engine/ engine/
COPY tokenizer/ tokenizer/
COPY server/ server/
COPY deploy/build-release.sh deploy/check-runtime-deps.sh deploy/install-runtime-deps.sh deploy/
RUN deploy/build-release.sh "${CUDA_ARCHITECTURES}" \
 && deploy/check-runtime-deps.sh build/fusedserve

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS runtime
ARG CUDA_VERSION
ARG UBUNTU_VERSION
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE_URL=
LABEL org.opencontainers.image.title="fusedserve" \
      org.opencontainers.image.description="gRPC inference service for fused transformer ops, transformer blocks and token generation on NVIDIA GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.base.name="nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}"

COPY deploy/install-runtime-deps.sh /tmp/install-runtime-deps.sh
RUN /tmp/install-runtime-deps.sh && rm /tmp/install-runtime-deps.sh

# Non-root user with a fixed uid/gid (the Kubernetes manifests run as 10001
# and give the cache volume to that group). The tuning cache and the model
# mount point belong to it; the root filesystem can be mounted read-only.
RUN groupadd --system --gid 10001 fusedserve \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin fusedserve \
 && install -d -o 10001 -g 10001 -m 0775 /var/cache/fusedserve \
 && install -d -o 10001 -g 10001 -m 0755 /models

COPY --from=builder /src/build/fusedserve /usr/local/bin/fusedserve
# Fails the build when a shared library is missing from the runtime image.
RUN ! ldd /usr/local/bin/fusedserve | grep "not found"

USER 10001:10001
WORKDIR /var/cache/fusedserve
# Tuning cache: persist it (a volume; in Kubernetes a shared PVC) so restarts
# and new replicas start warm. Models: mount a Hugging Face checkpoint at
# /models and pass --model=/models; without it the server uses random weights.
VOLUME ["/var/cache/fusedserve"]
# gRPC (FusedServe, grpc.health.v1, reflection) and Prometheus /metrics.
EXPOSE 50051 9090
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/fusedserve", "serve", \
            "--listen=0.0.0.0:50051", \
            "--metrics_listen=0.0.0.0:9090", \
            "--tuning_cache=/var/cache/fusedserve/tuning_cache.json"]
CMD ["--device=auto"]
