#!/usr/bin/env bash
# The aarch64 lane: cross-builds rsgl-kernels and rsgl-engine for aarch64-unknown-linux-gnu and runs
# their tests under qemu-user on several emulated CPUs and forced kernel paths, so every dispatch
# branch runs on an x86_64 box. The build runs in the Arm chroot (scripts/arm-chroot.sh). Needs root.
#
# By default every run tests the kernels crate whole and the engine's cross-ISA check
# (`same_bits_on_every_isa`: the recorded fingerprints on each path), and the first run also the
# engine's whole suite: the engine reaches the instruction set only through the kernels, so its
# other tests would repeat the first run's five times over (about 3 of qemu's minutes each).
#
# Usage: scripts/aarch64-test.sh [extra cargo test args, e.g. -- --nocapture]
# Env:   RSGL_ARM_CRATES  crates to test whole on every run instead (e.g. "rsgl-kernels");
#        RSGL_ARM_CHROOT and RSGL_ARM_MIRROR as scripts/arm-chroot.sh says
set -euo pipefail

HERE=$(dirname "${BASH_SOURCE[0]}")
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

# Runs `cargo test` in the chroot with qemu emulating cpu $1 and RSGL_KERNELS=$2; further args
# (which packages and tests, then the caller's) go to cargo. The build output stays in the
# chroot's /target: it links against the chroot's glibc.
run_tests_on() {
  local cpu=$1 kernels=$2; shift 2
  # -L / makes qemu use the chroot's libc6:arm64 for both ld.so and libc; mixing in the cross
  # toolchain's copy (/usr/aarch64-linux-gnu) hangs every thread spawn.
  RSGL_KERNELS="$kernels" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L /" \
    RSGL_ARM_PASS="RSGL_KERNELS CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER" \
    bash "$HERE/arm-chroot.sh" env CARGO_TARGET_DIR=/target \
    bash -c 'mkdir -p /target && cd /src && cargo test --target aarch64-unknown-linux-gnu "$@"' \
    cargo-test "$@"
}

# The cargo test selections of run number $1 (one per line).
selections_of_run() {
  if [ -n "${RSGL_ARM_CRATES:-}" ]; then
    printf -- '-p %s ' ${RSGL_ARM_CRATES}; echo
  elif [ "$1" = 0 ]; then
    echo "-p rsgl-kernels -p rsgl-engine"
  else
    echo "-p rsgl-kernels"
    echo "-p rsgl-engine --test same_bits_on_every_isa"
  fi
}

failed=()
for i in "${!RUNS[@]}"; do
  read -r cpu kernels <<<"${RUNS[$i]}"
  while read -r -a selection; do
    echo "===== aarch64 tests (${selection[*]}), qemu -cpu $cpu, RSGL_KERNELS=$kernels ====="
    run_tests_on "$cpu" "$kernels" "${selection[@]}" "$@" || failed+=("$cpu with $kernels kernels (${selection[*]})")
  done < <(selections_of_run "$i")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "aarch64-test: tests failed on: $(IFS=,; echo "${failed[*]}")" >&2
  exit 1
fi
echo "aarch64-test: all ${#RUNS[@]} runs passed"
