#!/usr/bin/env bash
# Builds what `pip install rsgl` downloads, into dist/: one abi3 wheel (every CPython from 3.11) per
# architecture, tagged manylinux_2_28 so RHEL 8-class systems take it, and the sdist. No
# target-cpu=native anywhere: each wheel holds every kernel path of its architecture (AVX2,
# AVX-512; NEON, SVE, I8MM...), picked at run time.
#
# - x86_64 here, with maturin, zig as the linker (it links against glibc 2.28's symbols whatever
#   the build machine's glibc is);
# - aarch64 cross-built in the Arm lane's chroot (scripts/arm-chroot.sh: its Rust has the arm64
#   standard library), with the same maturin and zig;
# then `auditwheel show` checks each wheel's tag against the symbols it needs.
#
# Usage: scripts/build-wheels.sh            (root, for the chroot)
# Env:   RSGL_WHEEL_TOOLS   venv for maturin, ziglang and auditwheel (default /var/tmp/rsgl-wheel-tools)
#        CARGO_TARGET_DIR   the x86_64 build's cargo target (default /var/tmp/rsgl-target-wheel)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=dist
POLICY=manylinux_2_28
TOOLS=${RSGL_WHEEL_TOOLS:-/var/tmp/rsgl-wheel-tools}
CHROOT=${RSGL_ARM_CHROOT:-/var/tmp/rsgl-aarch64-chroot}
# Where the tools go inside the chroot.
CHROOT_TOOLS=/opt/rsgl-wheel-tools
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/rsgl-target-wheel}

[ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS"
"$TOOLS/bin/pip" install -q --upgrade-strategy only-if-needed "maturin>=1.5,<2" "ziglang>=0.13" "auditwheel>=6"
rm -rf "$OUT"
mkdir -p "$OUT"

echo "== x86_64 wheel and sdist"
PATH="$TOOLS/bin:$PATH" maturin build --release --zig --compatibility "$POLICY" --target x86_64-unknown-linux-gnu --out "$OUT"
PATH="$TOOLS/bin:$PATH" maturin sdist --out "$OUT"

echo "== aarch64 wheel (cross-built in $CHROOT)"
bash scripts/arm-chroot.sh true # creates the chroot on first use
zig_package=$("$TOOLS/bin/python" -c 'import os, ziglang; print(os.path.dirname(ziglang.__file__))')
rm -rf "$CHROOT$CHROOT_TOOLS"
mkdir -p "$CHROOT$CHROOT_TOOLS/bin"
cp "$TOOLS/bin/maturin" "$CHROOT$CHROOT_TOOLS/bin/"
cp -a "$zig_package" "$CHROOT$CHROOT_TOOLS/ziglang"
ln -s ../ziglang/zig "$CHROOT$CHROOT_TOOLS/bin/zig"
bash scripts/arm-chroot.sh env PATH="$CHROOT_TOOLS/bin:/usr/bin:/bin" CARGO_TARGET_DIR=/target-wheel \
  bash -c 'cd /src && exec maturin build --release --zig --compatibility "$0" --target aarch64-unknown-linux-gnu --out "$1"' \
  "$POLICY" "$OUT"

echo "== checks"
for wheel in "$OUT"/*.whl; do
  "$TOOLS/bin/auditwheel" show "$wheel"
done
if grep -rn --include='*.toml' 'target-cpu' Cargo.toml pyproject.toml rust .cargo 2>/dev/null; then
  echo "build-wheels: a target-cpu setting would tie the wheels to one CPU" >&2
  exit 1
fi
ls -l "$REPO/$OUT"
