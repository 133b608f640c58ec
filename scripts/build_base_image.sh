#!/usr/bin/env bash
# Builds the Debian bookworm base image the Containerfiles start from, for machines that reach the
# Debian archive but no container registry. debootstrap writes a minimal root file system, which is
# packed into a tarball and imported with `podman import`. The tarball is kept outside the checkout
# (TIERROUTE_BUILD_CACHE, /var/cache/tierroute-build by default) so a second run only re-imports it.
#
# Usage: scripts/build_base_image.sh [image-name]     (default: localhost/tierroute-base:bookworm)
# The mirror is DEBIAN_MIRROR, or the first deb.debian.org-style URI this machine's apt uses.
set -euo pipefail

IMAGE=${1:-localhost/tierroute-base:bookworm}
CACHE=${TIERROUTE_BUILD_CACHE:-/var/cache/tierroute-build}
TARBALL=$CACHE/debian-bookworm-rootfs.tar

if podman image exists "$IMAGE"; then
  echo "base image $IMAGE exists"
  exit 0
fi

if [ ! -s "$TARBALL" ]; then
  command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }
  if [ -z "${DEBIAN_MIRROR:-}" ]; then
    # the same archive apt uses here (deb822 .sources or one-line .list), never a hard-coded host
    DEBIAN_MIRROR=$( { grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
      /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } | grep -oE 'https?://[^ ]+/debian/?( |$)' \
      | head -n 1 | tr -d ' ')
  fi
  [ -n "${DEBIAN_MIRROR:-}" ] || { echo "set DEBIAN_MIRROR: no Debian archive found in /etc/apt" >&2; exit 1; }
  mkdir -p "$CACHE"
  ROOT=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  trap 'rm -rf "$ROOT"' EXIT
  debootstrap --variant=minbase bookworm "$ROOT" "$DEBIAN_MIRROR"
  # the image's own apt uses the same archive, plus the security updates beside it
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$DEBIAN_MIRROR" "$DEBIAN_MIRROR" \
    > "$ROOT/etc/apt/sources.list"
  rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
  tar -C "$ROOT" --numeric-owner -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
fi

podman import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' "$TARBALL" "$IMAGE"
echo "base image $IMAGE imported from $TARBALL"
