#!/usr/bin/env bash
# Build the worker image (Dockerfile) with podman where Docker Hub is out of reach: a local
# Debian base made with debootstrap stands in for python:3.11-slim. Run as root.
#   scripts/build_image_podman.sh            # -> localhost/memstream:test
# Idempotent: the base rootfs and the base image are made once and then reused; the
# project image is rebuilt on every run (podman's layer cache keeps that quick).
# Settings (environment): BASE_TAG, IMAGE_TAG, SUITE, MIRROR, ROOTFS, CA_BUNDLE, NETWORK,
# RUNTIME (the OCI runtime of the build's RUN steps).
set -euo pipefail

BASE_TAG=${BASE_TAG:-localhost/memstream-base:py3}
IMAGE_TAG=${IMAGE_TAG:-localhost/memstream:test}
SUITE=${SUITE:-bookworm}                 # Debian 12: Python 3.11, as in python:3.11-slim
MIRROR=${MIRROR:-http://deb.debian.org/debian}
ROOTFS=${ROOTFS:-/var/tmp/memstream-rootfs-$SUITE}
# The host's CA bundle, mounted over the base's during the build only (the built image keeps
# Debian's own): pip then also trusts a TLS-intercepting egress proxy that the host trusts.
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
NETWORK=${NETWORK:-host}                 # the build's network: pip reaches PyPI through it
repo=$(cd "$(dirname "$0")/.." && pwd)

# 1. The base image: Debian minbase + python3, pip, venv (passwd, for groupadd/useradd, is
#    in minbase). Made once: skipped while the image exists.
if ! podman image exists "$BASE_TAG"; then
  # A rootfs is complete once its marker (next to it, not in it) exists: a debootstrap
  # that failed half-way is started again from scratch.
  if [[ ! -e "$ROOTFS.done" ]]; then
    command -v debootstrap >/dev/null || { apt-get update && apt-get install -y debootstrap; }
    rm -rf "$ROOTFS"
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
      "$SUITE" "$ROOTFS" "$MIRROR"
    # As in python:3.11-slim: root's `pip install` is allowed (no PEP 668 marker; Debian's
    # pip then installs into /usr/local), `python` is a command (the compose healthcheck
    # runs it), no apt lists or package cache in the image.
    rm -f "$ROOTFS"/usr/lib/python3*/EXTERNALLY-MANAGED
    ln -sf python3 "$ROOTFS/usr/bin/python"
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
      "$ROOTFS"/var/cache/apt/archives/*.deb
    touch "$ROOTFS.done"
  fi
  tar --numeric-owner -C "$ROOTFS" -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$BASE_TAG"
fi

# 2. The project image: the unchanged Dockerfile, on the local base.
opts=(--network "$NETWORK")
[[ -n "$CA_BUNDLE" && -f "$CA_BUNDLE" ]] &&
  opts+=(--volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro")
# crun refuses hybrid cgroups (v1 controllers + a v2 mount at /sys/fs/cgroup/unified): runc
# copes. Podman's default RUN-step limits (1048576 files) need CAP_SYS_RESOURCE, which a
# sandboxed root may lack: lower ones fit anywhere (the build's RUN steps only, not the image).
if [[ -z "${RUNTIME:-}" ]] && mountpoint -q /sys/fs/cgroup/unified 2>/dev/null &&
   command -v runc >/dev/null; then
  RUNTIME=runc
fi
[[ -n "${RUNTIME:-}" ]] && opts+=(--runtime "$RUNTIME")
opts+=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
podman build "${opts[@]}" --build-arg BASE_IMAGE="$BASE_TAG" -t "$IMAGE_TAG" "$repo"

echo "$IMAGE_TAG"
