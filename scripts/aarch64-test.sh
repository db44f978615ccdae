#!/usr/bin/env bash
# The aarch64 lane: cross-builds rsgl-kernels and rsgl-engine for aarch64-unknown-linux-gnu and runs
# their tests under qemu-user on several emulated CPUs and forced kernel paths, so every dispatch
# branch runs on an x86_64 box.
#
# rustup here has no aarch64 standard library, so the build runs in a Debian trixie chroot whose
# packaged Rust (rustc-web/cargo-web) ships one (libstd-rust-web-dev:arm64). The chroot is
# debootstrapped on first use (a few minutes, about 2 GB) and reused afterwards. Needs root.
#
# Usage: scripts/aarch64-test.sh [extra cargo test args, e.g. -- --nocapture]
# Env:   RSGL_ARM_CHROOT  chroot directory (default /var/tmp/rsgl-aarch64-chroot)
#        RSGL_ARM_MIRROR  Debian mirror    (default http://deb.debian.org/debian)
#        RSGL_ARM_CRATES  crates to test   (default "rsgl-kernels rsgl-engine")
set -euo pipefail

CHROOT=${RSGL_ARM_CHROOT:-/var/tmp/rsgl-aarch64-chroot}
MIRROR=${RSGL_ARM_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CRATES=(${RSGL_ARM_CRATES:-rsgl-kernels rsgl-engine})
# One run per line: the qemu CPU, then RSGL_KERNELS. `max` has every feature (BF16, SVE): auto
# picks the SVE path there, run at the narrowest and a wide vector length; neon-bf16 forced on
# `max` covers BF16 CPUs without SVE; neoverse-n1 has no SVE and no BF16 (NEON + dotprod), so
# auto picks plain NEON there; portable forced on `max` runs the fallback where a better path
# exists.
RUNS=("max,sve-default-vector-length=16 auto"
      "max,sve-default-vector-length=64 auto"
      "max neon-bf16"
      "neoverse-n1 auto"
      "max portable")
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

die() { echo "aarch64-test: $*" >&2; exit 1; }

# Builds the chroot in a side directory and renames it into place only once complete.
create_chroot() {
  local partial="$CHROOT.partial"
  echo "aarch64-test: creating the Debian $SUITE chroot in $CHROOT (first run only)"
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

# Runs `cargo test` in the chroot with qemu emulating cpu $1 and RSGL_KERNELS=$2; further args go
# to cargo.
run_tests_on() {
  local cpu=$1 kernels=$2; shift 2
  local passed=() packages=()
  for c in "${CRATES[@]}"; do packages+=(-p "$c"); done
  for v in "${PASSED_VARS[@]}"; do
    if [ -n "${!v+x}" ]; then passed+=("$v=${!v}"); fi
  done
  # -L / makes qemu use the chroot's libc6:arm64 for both ld.so and libc; mixing in the cross
  # toolchain's copy (/usr/aarch64-linux-gnu) hangs every thread spawn.
  chroot "$CHROOT" env -i PATH=/usr/bin:/bin HOME=/root CARGO_HOME=/cargo-home CARGO_TARGET_DIR=/target \
    CARGO_HTTP_CAINFO="$CHROOT_CA" "${passed[@]}" RSGL_KERNELS="$kernels" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L /" \
    bash -c 'cd /src && cargo test --target aarch64-unknown-linux-gnu "$@"' \
    cargo-test "${packages[@]}" "$@"
}

# Inside the private mount namespace: mount, do every run, report. Mounts vanish on exit.
run_all() {
  mount -t proc proc "$CHROOT/proc"
  mount --rbind /dev "$CHROOT/dev"
  mount --bind "$REPO" "$CHROOT/src"
  local failed=()
  local cpu kernels
  for run in "${RUNS[@]}"; do
    read -r cpu kernels <<<"$run"
    echo "===== aarch64 tests (${CRATES[*]}), qemu -cpu $cpu, RSGL_KERNELS=$kernels ====="
    run_tests_on "$cpu" "$kernels" "$@" || failed+=("$cpu with $kernels kernels")
  done
  if [ ${#failed[@]} -gt 0 ]; then
    die "tests failed on: $(IFS=,; echo "${failed[*]}")"
  fi
  echo "aarch64-test: all ${#RUNS[@]} runs passed"
}

if [ "${RSGL_ARM_IN_NAMESPACE:-}" = 1 ]; then
  run_all "$@"
  exit 0
fi

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mount)"
[ -e "$CHROOT/$READY_MARK" ] || create_chroot
# crates.io is fetched from inside the chroot.
cp -L /etc/resolv.conf "$CHROOT/etc/resolv.conf"
cp -L "$HOST_CA" "$CHROOT$CHROOT_CA" 2>/dev/null || cp "$CHROOT/etc/ssl/certs/ca-certificates.crt" "$CHROOT$CHROOT_CA"
# The build output stays in the chroot: it links against the chroot's glibc.
mkdir -p "$CHROOT/src" "$CHROOT/cargo-home" "$CHROOT/target"
RSGL_ARM_IN_NAMESPACE=1 exec unshare --mount --propagation private -- bash "${BASH_SOURCE[0]}" "$@"
