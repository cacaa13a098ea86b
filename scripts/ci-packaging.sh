#!/usr/bin/env bash
# Packaging checks (issue 9), run by scripts/test.sh after the test suite; can also run alone.
#  1. static musl x86_64 build: `ldd` must say it is static; the static binary builds, verifies and
#     runs the default bundle, and answers exactly what the glibc build answers (same kernels).
#  2. aarch64: the core test subset (lib unit tests incl. the NEON kernels, tests/bundle_hostile.rs,
#     tests/import_gguf.rs, tests/cli.rs) cross-built with gcc-aarch64-linux-gnu and run under
#     qemu-aarch64; then the aarch64 binary (test profile, debug assertions on) verifies and runs
#     the default bundle under qemu, so the NEON kernels run on a real model; the answer at
#     temperature 0 with the scalar kernels must equal the host's scalar-reference answer exactly
#     (the NEON set must answer too; its kernels are unit-tested against the reference).
#  3. Debian package: man pages from the clap definitions, `cargo deb`, lintian, then `dpkg -i` into
#     a clean Debian 12 chroot made with debootstrap (cached): `applianced --version`, user, dirs,
#     conffiles, `systemd-analyze verify` of the installed units, `systemd-analyze security
#     --offline=yes` of the installed service <= 1.0, then purge.
# Installs its own tools (apt packages, rustup targets, cargo-deb) when missing. Needs root (apt,
# chroot, binfmt_misc). Every check fails loudly; nothing is skipped. Timings go to stderr and to
# target/ci-packaging/times.txt; figures (sizes) to target/ci-packaging/figures.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE="${APPLIANCED_CACHE:-$ROOT/.cache}"
OUT=target/ci-packaging
mkdir -p "$OUT" "$CACHE/pkg-ci"
: >"$OUT/times.txt"
: >"$OUT/figures.txt"
CARGO_DEB_VERSION=3.8.0
MUSL=x86_64-unknown-linux-musl
ARM=aarch64-unknown-linux-gnu

log() { echo "ci-packaging: $*" >&2; }
die() { echo "ci-packaging: FAILED: $*" >&2; exit 1; }
T0=$SECONDS
step_start() { STEP="$1"; STEP_T=$SECONDS; log "== $STEP"; }
step_end() { local d=$((SECONDS - STEP_T)); echo "$STEP: ${d}s" | tee -a "$OUT/times.txt" >&2; }

# ---------------------------------------------------------------- tools
step_start "tools"
PKGS=()
command -v musl-gcc >/dev/null || PKGS+=(musl-tools)
command -v aarch64-linux-gnu-gcc >/dev/null || PKGS+=(gcc-aarch64-linux-gnu)
[ -f /usr/aarch64-linux-gnu/lib/libc.so.6 ] || PKGS+=(libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null || PKGS+=(qemu-user-static)
command -v debootstrap >/dev/null || PKGS+=(debootstrap)
command -v lintian >/dev/null || PKGS+=(lintian)
command -v systemd-analyze >/dev/null || PKGS+=(systemd)
if [ ${#PKGS[@]} -gt 0 ]; then
  log "installing ${PKGS[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
fi
INSTALLED_TARGETS=$(rustup target list --installed)
for t in $MUSL $ARM; do
  grep -qx "$t" <<<"$INSTALLED_TARGETS" || rustup target add "$t"
done
if ! cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
  cargo install cargo-deb --locked --version "$CARGO_DEB_VERSION"
fi
# qemu-aarch64 through binfmt_misc, so that tests/cli.rs can spawn the aarch64 binary.
# A sandbox may forbid binfmt_misc: then tests/cli.rs is announced as not run on aarch64 (the
# aarch64 binary itself still runs verify and run under qemu-aarch64-static below).
BINFMT=1
{ [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null; } \
  && { [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || /lib/systemd/systemd-binfmt /usr/lib/binfmt.d/qemu-aarch64.conf; } \
  && grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null \
  || { BINFMT=0; log "NOTE: binfmt_misc unavailable here: tests/cli.rs will NOT run on aarch64 (it spawns the binary)"; }
step_end

part_musl() {
  step_start "musl x86_64 static build"
  # Without debug info (CI's time and disk budget; this binary is only checked, and a release
  # strips it anyway).
  CARGO_PROFILE_RELEASE_DEBUG=0 CC_x86_64_unknown_linux_musl=musl-gcc cargo build --release --quiet --target $MUSL --no-default-features --bin applianced
  step_end
  S=target/$MUSL/release/applianced
  LDD=$(ldd "$S" 2>&1 || true)
  log "ldd $S: $LDD"
  grep -Eq "not a dynamic executable|statically linked" <<<"$LDD" || die "musl binary is not static: $LDD"
  file "$S" | grep -Eq "statically linked|static-pie linked" || die "file(1) does not call the musl binary static: $(file "$S")"
  step_start "musl binary: keygen, build, verify, run"
  "$S" keygen --out "$W/k-musl" >/dev/null
  [ -s "$W/k-musl.pub" ] || die "musl keygen wrote no key"
  # The static build's bundle must verify with the glibc build. (Not byte-compared: the default
  # bundle's compiled schema, schemas/invoice.bin, differs from build to build even with one binary.)
  # The static build has no GPU backends (no NVRTC to compile PTX with): --no-kernels.
  "$S" build bundles/smollm2-135m.toml --no-kernels --model "$GGUF" --key "$W/k.key" --out "$W/default-musl.zlb" -q >/dev/null
  if "$S" build bundles/smollm2-135m.toml --model "$GGUF" --key "$W/k.key" --out "$W/nok.zlb" -q 2>"$W/nok.txt"; then die "musl build of a [kernels] recipe did not fail"; fi
  grep -q "no CUDA support" "$W/nok.txt" || die "musl build of a [kernels] recipe: unclear error: $(cat "$W/nok.txt")"
  "$H" verify "$W/default-musl.zlb" --trust "$W/k.pub" >/dev/null || die "glibc build rejects the musl-built bundle"
  "$S" verify "$W/default.zlb" --trust "$W/k.pub" | tee "$W/verify-musl.txt" >&2
  grep -q "^OK " "$W/verify-musl.txt" || die "musl verify did not print OK"
  "$S" run "$W/default.zlb" --trust "$W/k.pub" --prompt "$PROMPT" --max-tokens 24 --temperature 0 >"$W/run-musl.txt"
  log "musl answer: $(cat "$W/run-musl.txt")"
  [ -s "$W/run-musl.txt" ] || die "musl run printed nothing"
  cmp -s "$W/run-musl.txt" "$W/run-glibc.txt" || die "musl and glibc answers differ: '$(cat "$W/run-musl.txt")' vs '$(cat "$W/run-glibc.txt")'"
  step_end

}

part_arm() {
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
  export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
  export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64-static
  # The test profile without debug info (debug assertions stay on): full DWARF for a cross build
  # that only runs under qemu was most of this step's time.
  export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0
  # CPU-only features on aarch64 under qemu (no GPU there; NEON kernels are what is tested).
  ARM_TESTS=(--no-default-features --lib --test bundle_hostile --test import_gguf)
  if [ "$BINFMT" = 1 ]; then ARM_TESTS+=(--test cli); else log "NOT RUN on aarch64: tests/cli.rs (no binfmt_misc)"; fi
  ARM_BINARIES=$(( 1 + (${#ARM_TESTS[@]} - 2) / 2 ))
  step_start "aarch64 build (test profile: tests + the binary tests/cli.rs runs)"
  cargo test --target $ARM "${ARM_TESTS[@]}" --no-run --quiet
  step_end
  step_start "aarch64 tests under qemu"
  # The runner runs the test binaries; tests/cli.rs spawns the aarch64 binary through binfmt_misc.
  cargo test --target $ARM "${ARM_TESTS[@]}" -- --test-threads 2 >"$W/arm-tests.txt" 2>&1 \
    || { tail -60 "$W/arm-tests.txt" >&2; die "aarch64 tests failed under qemu (log: $W/arm-tests.txt)"; }
  grep -E "^test result|Running" "$W/arm-tests.txt" >&2
  [ "$(grep -c "^test result: ok" "$W/arm-tests.txt")" -eq "$ARM_BINARIES" ] || die "expected $ARM_BINARIES passing aarch64 test binaries (see $W/arm-tests.txt)"
  grep -q "neon_matches_reference ... ok" "$W/arm-tests.txt" || die "the NEON kernel test did not run"
  step_end
  # The test-profile binary (debug assertions on; dependencies optimized) on the real model.
  step_start "aarch64 binary under qemu: verify, run"
  A=target/$ARM/debug/applianced
  file "$A" | grep -q "ARM aarch64" || die "not an aarch64 binary: $(file "$A")"
  qemu-aarch64-static "$A" verify "$W/default.zlb" --trust "$W/k.pub" >&2
  # The NEON set (panel kernels: the reference's integer sums, its own f32 order, so a greedy
  # answer may part from x86's where two tokens are nearly tied, as AVX2 and AVX-512 do) must
  # answer; its kernels are checked against the reference by the unit tests above. The scalar
  # set on aarch64 must give the x86_64 scalar answer bit for bit.
  qemu-aarch64-static "$A" run "$W/default.zlb" --trust "$W/k.pub" --prompt "$PROMPT" --max-tokens 24 --temperature 0 >"$W/run-arm.txt"
  [ -s "$W/run-arm.txt" ] || die "aarch64 run printed nothing"
  log "aarch64 NEON answer: $(cat "$W/run-arm.txt")"
  APPLIANCED_CPU_KERNELS=scalar qemu-aarch64-static "$A" run "$W/default.zlb" --trust "$W/k.pub" --prompt "$PROMPT" --max-tokens 24 --temperature 0 >"$W/run-arm-scalar.txt"
  cmp -s "$W/run-arm-scalar.txt" "$W/run-scalar.txt" \
    || die "aarch64 scalar answer '$(cat "$W/run-arm-scalar.txt")' differs from the x86_64 scalar-reference answer: '$(cat "$W/run-scalar.txt")'"
  log "aarch64 scalar answer = x86_64 scalar-reference answer"
  step_end

}

part_deb() {
  step_start "man pages + cargo deb + lintian"
  rm -rf target/man
  cargo run --release --quiet --example mangen -- target/man
  gzip -9nf target/man/*.1
  rm -f target/debian/applianced_*.deb
  cargo deb --no-build --strip --quiet >/dev/null
  DEB=$(ls target/debian/applianced_*.deb)
  dpkg-deb --info "$DEB" >"$W/deb-info.txt"
  dpkg-deb --contents "$DEB" | tee "$W/deb-contents.txt" >&2
  for f in ./usr/bin/applianced ./lib/systemd/system/applianced.service ./lib/systemd/system/applianced.socket \
           ./usr/lib/sysusers.d/applianced.conf ./usr/lib/tmpfiles.d/applianced.conf ./etc/applianced/config.toml \
           ./etc/applianced/trusted.d/revoked ./usr/share/man/man1/applianced.1.gz; do
    grep -q " $f\$" "$W/deb-contents.txt" || die "$f missing from the package"
  done
  # Errors and warnings fail. The package's own overrides (with reasons): packaging/lintian/applianced.
  lintian --fail-on error,warning "$DEB" 2>&1 | tee "$W/lintian.txt" >&2 || die "lintian reports errors or warnings (see above)"
  step_end

  step_start "debootstrap Debian 12 base (cached)"
  # procps: the unit's ExecReload runs /bin/kill (the package depends on it).
  BASE="$CACHE/pkg-ci/bookworm-base-procps"
  if [ ! -f "$BASE/.complete" ]; then
    rm -rf "$BASE"
    debootstrap --variant=minbase --include=systemd,man-db,procps bookworm "$BASE" http://deb.debian.org/debian >"$CACHE/pkg-ci/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/pkg-ci/debootstrap.log" >&2; die "debootstrap failed"; }
    touch "$BASE/.complete"
  fi
  step_end

  step_start "install in a clean Debian 12 chroot and verify"
  R="$CACHE/pkg-ci/chroot"
  cleanup() { umount "$R/proc" 2>/dev/null || true; }
  trap cleanup EXIT
  cleanup
  rm -rf "$R"
  cp -a "$BASE" "$R"
  mount -t proc proc "$R/proc"
  cp "$DEB" "$R/tmp/applianced.deb"
  in_chroot() { chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
  in_chroot dpkg -i /tmp/applianced.deb >&2 || die "dpkg -i failed"
  V=$(in_chroot applianced --version) || die "applianced --version failed in the chroot"
  log "in chroot: $V"
  [ "$V" = "applianced $(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["packages"][0]["version"])')" ] || die "unexpected version: $V"
  in_chroot getent passwd applianced | grep -q ":/var/lib/applianced:/usr/sbin/nologin$" || die "system user applianced missing or wrong"
  for d in /var/lib/applianced /var/log/applianced /run/applianced; do
    [ "$(in_chroot stat -c %U:%G "$d")" = applianced:applianced ] || die "$d missing or not owned by applianced"
  done
  CONF=$(in_chroot dpkg-query -W -f='${Conffiles}\n' applianced)
  for f in /etc/applianced/config.toml /etc/applianced/trusted.d/revoked; do
    grep -q " $f " <<<"$CONF" || die "$f is not a conffile"
  done
  in_chroot man -w applianced >/dev/null || die "man applianced not found"
  in_chroot systemd-analyze verify /lib/systemd/system/applianced.socket /lib/systemd/system/applianced.service /lib/systemd/system/applianced-pull.service /lib/systemd/system/applianced-pull.timer >"$W/verify-units.txt" 2>&1 \
    || { cat "$W/verify-units.txt" >&2; die "systemd-analyze verify failed"; }
  [ ! -s "$W/verify-units.txt" ] || { cat "$W/verify-units.txt" >&2; die "systemd-analyze verify printed warnings"; }
  log "systemd-analyze verify of the installed units: clean"
  in_chroot systemd-analyze security --offline=yes --threshold=10 /lib/systemd/system/applianced.service >"$W/security.txt" 2>&1 \
    || { cat "$W/security.txt" >&2; die "systemd-analyze security above 1.0"; }
  EXPOSURE=$(sed -n 's/.*Overall exposure level for applianced.service: \([0-9.]*\).*/\1/p' "$W/security.txt")
  [ -n "$EXPOSURE" ] || die "no exposure level in systemd-analyze security output"
  log "systemd-analyze security --offline=yes: exposure $EXPOSURE"
  in_chroot dpkg --purge applianced >&2 || die "dpkg --purge failed"
  in_chroot test ! -e /usr/bin/applianced || die "binary left after purge"
  in_chroot test ! -e /etc/applianced/config.toml || die "conffile left after purge"
  cleanup
  trap - EXIT
  rm -rf "$R"
  step_end

}

# The default bundle, built once by the host (glibc) binary; the other builds verify and run it.
PROMPT="What is the capital of France?"
W="$CACHE/pkg-ci/work"
rm -rf "$W" && mkdir -p "$W"
step_start "default bundle (host build)"
GGUF="${APPLIANCED_TEST_GGUF:-$(scripts/fetch-model.sh)}"
cargo build --release --quiet --bin applianced
H=target/release/applianced
"$H" keygen --out "$W/k" >/dev/null
"$H" build bundles/smollm2-135m.toml --model "$GGUF" --key "$W/k.key" --out "$W/default.zlb" -q >/dev/null
"$H" run "$W/default.zlb" --trust "$W/k.pub" --prompt "$PROMPT" --max-tokens 24 --temperature 0 >"$W/run-glibc.txt"
[ -s "$W/run-glibc.txt" ] || die "host run printed nothing"
# The scalar reference kernels: the aarch64 binary's scalar set must give this answer bit for bit.
APPLIANCED_CPU_KERNELS=scalar "$H" run "$W/default.zlb" --trust "$W/k.pub" --prompt "$PROMPT" --max-tokens 24 --temperature 0 >"$W/run-scalar.txt"
step_end

PARTS="${*:-musl arm deb}"
for p in $PARTS; do
  case $p in musl|arm|deb) "part_$p";; *) die "unknown part $p (musl, arm, deb)";; esac
done

# ---------------------------------------------------------------- figures
{
  for b in target/release/applianced target/$MUSL/release/applianced; do
    [ -f "$b" ] || continue
    s=$(mktemp)
    strip -o "$s" "$b"
    echo "$b stripped: $(stat -c %s "$s") bytes"
    rm -f "$s"
  done
  if [ -n "${DEB:-}" ]; then
    echo "$DEB: $(stat -c %s "$DEB") bytes"
    echo "systemd-analyze security exposure: $EXPOSURE"
  fi
} | tee "$OUT/figures.txt" >&2
log "all packaging checks passed in $((SECONDS - T0))s"
