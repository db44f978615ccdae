#!/usr/bin/env bash
# The Arm lane's build environment, shared by scripts/aarch64-test.sh and scripts/build-wheels.sh.
#
# rustup here has no aarch64 standard library, so aarch64 builds run in a Debian trixie chroot whose
# packaged Rust (rustc-web/cargo-web) ships one (libstd-rust-web-dev:arm64), with qemu-user to run
# the result. The chroot is debootstrapped on first use (a few minutes, about 2 GB) and reused
# afterwards. Needs root.
#
# Usage: scripts/arm-chroot.sh COMMAND [ARGS...]   runs COMMAND inside the chroot, the repository
#        mounted at /src, in a private mount namespace (the mounts vanish on exit). The environment
#        is empty but for PATH, HOME, CARGO_HOME=/cargo-home, the CA bundle, the variables listed
#        in PASSED_VARS and those named in RSGL_ARM_PASS (space-separated).
# Env:   RSGL_ARM_CHROOT  chroot directory (default /var/tmp/rsgl-aarch64-chroot)
#        RSGL_ARM_MIRROR  Debian mirror    (default http://deb.debian.org/debian)
set -euo pipefail

CHROOT=${RSGL_ARM_CHROOT:-/var/tmp/rsgl-aarch64-chroot}
MIRROR=${RSGL_ARM_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PACKAGES=(rustc-web cargo-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross
          qemu-user ca-certificates)
# Marks a chroot whose packages all installed (a debootstrap cut short leaves no mark).
READY_MARK=.rsgl-aarch64-ready
# The host's CA bundle, copied in so cargo trusts what the host trusts (e.g. a TLS-inspecting proxy).
HOST_CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
CHROOT_CA=/etc/ssl/certs/rsgl-host-ca.crt
# Host variables worth carrying into the chroot when set.
PASSED_VARS=(RUSTFLAGS RUST_BACKTRACE CARGO_TERM_COLOR CARGO_NET_OFFLINE
             http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY)

die() { echo "arm-chroot: $*" >&2; exit 1; }

# Builds the chroot in a side directory and renames it into place only once complete.
create_chroot() {
  local partial="$CHROOT.partial"
  echo "arm-chroot: creating the Debian $SUITE chroot in $CHROOT (first run only)"
  command -v debootstrap >/dev/null || { apt-get update -q; apt-get install -y -q debootstrap; }
  rm -rf --one-file-system "$partial"
  debootstrap --variant=minbase "$SUITE" "$partial" "$MIRROR"
  printf 'deb %s %s main\ndeb %s %s-updates main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
    "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" "$SUITE" > "$partial/etc/apt/sources.list"
  cp -L /etc/resolv.conf "$partial/etc/resolv.conf"
  chroot "$partial" dpkg --add-architecture arm64
  chroot "$partial" apt-get update -q
  chroot "$partial" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
  chroot "$partial" apt-get clean
  touch "$partial/$READY_MARK"
  mv "$partial" "$CHROOT"
}

# Inside the private mount namespace: mount, then run the command in the chroot.
if [ "${RSGL_ARM_IN_NAMESPACE:-}" = 1 ]; then
  mount -t proc proc "$CHROOT/proc"
  mount --rbind /dev "$CHROOT/dev"
  mount --bind "$REPO" "$CHROOT/src"
  passed=()
  for v in "${PASSED_VARS[@]}" ${RSGL_ARM_PASS:-}; do
    if [ -n "${!v+x}" ]; then passed+=("$v=${!v}"); fi
  done
  exec chroot "$CHROOT" env -i PATH=/usr/bin:/bin HOME=/root CARGO_HOME=/cargo-home \
    CARGO_HTTP_CAINFO="$CHROOT_CA" "${passed[@]}" "$@"
fi

[ $# -gt 0 ] || die "usage: scripts/arm-chroot.sh COMMAND [ARGS...]"
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mount)"
[ -e "$CHROOT/$READY_MARK" ] || create_chroot
# crates.io is fetched from inside the chroot.
cp -L /etc/resolv.conf "$CHROOT/etc/resolv.conf"
cp -L "$HOST_CA" "$CHROOT$CHROOT_CA" 2>/dev/null || cp "$CHROOT/etc/ssl/certs/ca-certificates.crt" "$CHROOT$CHROOT_CA"
mkdir -p "$CHROOT/src" "$CHROOT/cargo-home"
RSGL_ARM_IN_NAMESPACE=1 exec unshare --mount --propagation private -- bash "${BASH_SOURCE[0]}" "$@"
