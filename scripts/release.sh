#!/usr/bin/env bash
# Release builds into dist/, with SHA256SUMS:
#   applianced-VERSION-x86_64-linux-gnu    glibc >= 2.17 (cargo-zigbuild), every backend (--all-features)
#   applianced-VERSION-x86_64-linux-musl   fully static (musl-gcc), CPU only (--no-default-features)
#   applianced-VERSION-aarch64-linux-gnu   glibc >= 2.17 (cargo-zigbuild), every backend
#   applianced-VERSION-aarch64-linux-musl  fully static (cargo-zigbuild), CPU only
#   applianced_VERSION-1_amd64.deb, applianced_VERSION-1_arm64.deb (cargo-deb, from the glibc builds)
# Binaries are stripped. Each build's wall time goes to dist/build-times.txt. Checks: the glibc
# builds need no symbol version above GLIBC_2.17; the musl builds are static.
# Installs what it needs when missing: apt packages (musl-tools, binutils-aarch64-linux-gnu), rustup
# targets, cargo-zigbuild and cargo-deb (crates.io), zig (the `ziglang` wheel from PyPI, in
# .cache/release-venv). Needs root for apt only when a package is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE="${APPLIANCED_CACHE:-$ROOT/.cache}"
CARGO_DEB_VERSION=3.8.0
CARGO_ZIGBUILD_VERSION=0.24.1
ZIGLANG_VERSION=0.14.1
VERSION=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["packages"][0]["version"])')
DIST=dist
TD="${CARGO_TARGET_DIR:-target}"
log() { echo "release: $*" >&2; }
die() { echo "release: FAILED: $*" >&2; exit 1; }

# ---------------------------------------------------------------- tools
PKGS=()
command -v musl-gcc >/dev/null || PKGS+=(musl-tools)
command -v aarch64-linux-gnu-strip >/dev/null || PKGS+=(binutils-aarch64-linux-gnu)
if [ ${#PKGS[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
fi
INSTALLED_TARGETS=$(rustup target list --installed)
for t in x86_64-unknown-linux-gnu x86_64-unknown-linux-musl aarch64-unknown-linux-gnu aarch64-unknown-linux-musl; do
  grep -qx "$t" <<<"$INSTALLED_TARGETS" || rustup target add "$t"
done
cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION" || cargo install cargo-deb --locked --version "$CARGO_DEB_VERSION"
cargo-zigbuild --version 2>/dev/null | grep -q "$CARGO_ZIGBUILD_VERSION" || cargo install cargo-zigbuild --locked --version "$CARGO_ZIGBUILD_VERSION"
VENV="$CACHE/release-venv"
if ! "$VENV/bin/python" -m ziglang version 2>/dev/null | grep -q "^$ZIGLANG_VERSION"; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "ziglang==$ZIGLANG_VERSION"
fi
# cargo-zigbuild runs `python3 -m ziglang` when no `zig` is on PATH; the venv's python3 comes first.
export PATH="$VENV/bin:$PATH"

rm -rf "$DIST" && mkdir -p "$DIST"
: >"$DIST/build-times.txt"
timed() { local name=$1 t=$SECONDS; shift; log "== $name: $*"; "$@"; echo "$name: $((SECONDS - t))s" | tee -a "$DIST/build-times.txt" >&2; }

# ---------------------------------------------------------------- builds
timed x86_64-linux-gnu cargo zigbuild --release --quiet --target x86_64-unknown-linux-gnu.2.17 --all-features --bin applianced
CC_x86_64_unknown_linux_musl=musl-gcc timed x86_64-linux-musl cargo build --release --quiet --target x86_64-unknown-linux-musl --no-default-features --bin applianced
timed aarch64-linux-gnu cargo zigbuild --release --quiet --target aarch64-unknown-linux-gnu.2.17 --all-features --bin applianced
timed aarch64-linux-musl cargo zigbuild --release --quiet --target aarch64-unknown-linux-musl --no-default-features --bin applianced

max_glibc() { objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1; }
for spec in x86_64-unknown-linux-gnu:x86_64-linux-gnu:strip aarch64-unknown-linux-gnu:aarch64-linux-gnu:aarch64-linux-gnu-strip \
            x86_64-unknown-linux-musl:x86_64-linux-musl:strip aarch64-unknown-linux-musl:aarch64-linux-musl:aarch64-linux-gnu-strip; do
  IFS=: read -r triple name stripper <<<"$spec"
  b=$TD/$triple/release/applianced
  out="$DIST/applianced-$VERSION-$name"
  "$stripper" -o "$out" "$b"
  case $name in
    *gnu)
      g=$(max_glibc "$out")
      [ "$(printf '%s\n' "$g" GLIBC_2.17 | sort -V | tail -n1)" = GLIBC_2.17 ] || die "$name needs $g (> GLIBC_2.17)"
      log "$name: highest glibc symbol version $g";;
    *musl)
      file "$out" | grep -Eq "statically linked|static-pie linked" || die "$name is not static: $(file "$out")";;
  esac
done

# ---------------------------------------------------------------- Debian packages (from the glibc 2.17 builds)
# Man pages: the mangen example, built like the x86_64 glibc release (reuses its dependencies).
timed mangen cargo zigbuild --release --quiet --target x86_64-unknown-linux-gnu.2.17 --all-features --example mangen
rm -rf target/man
"$TD/x86_64-unknown-linux-gnu/release/examples/mangen" target/man
gzip -9nf target/man/*.1
for triple in x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu; do
  # Package the stripped binary (cargo-deb cannot strip a cross binary without extra config).
  cp "$DIST/applianced-$VERSION-${triple/-unknown/}" "$TD/$triple/release/applianced.stripped"
  mv "$TD/$triple/release/applianced.stripped" "$TD/$triple/release/applianced"
  timed "deb-$triple" cargo deb --no-build --no-strip --quiet --target "$triple" --output "$DIST/" >/dev/null
done

(cd "$DIST" && sha256sum applianced* >SHA256SUMS && sha256sum -c --quiet SHA256SUMS)
log "sizes:"; (cd "$DIST" && ls -l applianced* SHA256SUMS) >&2
log "done: $DIST/"
