#!/usr/bin/env bash
# A Debian base image with python3 for deploy/Dockerfile's BASE_IMAGE, made without a registry:
# debootstrap from Debian's mirror, this host's extra CA certificates (a TLS-intercepting proxy's,
# which pip in the build needs), then `import` into the container engine.
#
#     deploy/base-image.sh [podman|docker] [IMAGE]      # default: podman, localhost/bookworm-python:latest
#
# Needs root and debootstrap (apt-get install -y debootstrap). About 70 s.
set -euo pipefail
engine="${1:-podman}"
image="${2:-localhost/bookworm-python:latest}"
rootfs="$(mktemp -d /tmp/haremq-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" >/dev/null
# CA certificates added on this host (none on most machines; behind an intercepting proxy, its CA)
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
  chroot "$rootfs" update-ca-certificates >/dev/null
fi
tar -C "$rootfs" -c . | "$engine" import - "$image" >/dev/null
echo "$image"
