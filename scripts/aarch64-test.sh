#!/usr/bin/env bash
# The aarch64 lane: cross-builds rsgl-kernels and rsgl-engine for aarch64-unknown-linux-gnu and runs
# their tests under qemu-user on several emulated CPUs and forced kernel paths, so every dispatch
# branch runs on an x86_64 box. The build runs in the Arm chroot (scripts/arm-chroot.sh). Needs root.
#
# Usage: scripts/aarch64-test.sh [extra cargo test args, e.g. -- --nocapture]
# Env:   RSGL_ARM_CRATES  crates to test   (default "rsgl-kernels rsgl-engine"); RSGL_ARM_CHROOT and
#        RSGL_ARM_MIRROR as scripts/arm-chroot.sh says
set -euo pipefail

HERE=$(dirname "${BASH_SOURCE[0]}")
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

# Runs `cargo test` in the chroot with qemu emulating cpu $1 and RSGL_KERNELS=$2; further args go
# to cargo. The build output stays in the chroot's /target: it links against the chroot's glibc.
run_tests_on() {
  local cpu=$1 kernels=$2; shift 2
  local packages=()
  for c in "${CRATES[@]}"; do packages+=(-p "$c"); done
  # -L / makes qemu use the chroot's libc6:arm64 for both ld.so and libc; mixing in the cross
  # toolchain's copy (/usr/aarch64-linux-gnu) hangs every thread spawn.
  RSGL_KERNELS="$kernels" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L /" \
    RSGL_ARM_PASS="RSGL_KERNELS CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER" \
    bash "$HERE/arm-chroot.sh" env CARGO_TARGET_DIR=/target \
    bash -c 'mkdir -p /target && cd /src && cargo test --target aarch64-unknown-linux-gnu "$@"' \
    cargo-test "${packages[@]}" "$@"
}

failed=()
for run in "${RUNS[@]}"; do
  read -r cpu kernels <<<"$run"
  echo "===== aarch64 tests (${CRATES[*]}), qemu -cpu $cpu, RSGL_KERNELS=$kernels ====="
  run_tests_on "$cpu" "$kernels" "$@" || failed+=("$cpu with $kernels kernels")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "aarch64-test: tests failed on: $(IFS=,; echo "${failed[*]}")" >&2
  exit 1
fi
echo "aarch64-test: all ${#RUNS[@]} runs passed"
