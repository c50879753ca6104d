#!/bin/bash
# Builds the nftgate kernel package: Debian's Linux source, configured as the
# stock gokrazy amd64 kernel plus config.fragment, laid out the way gok reads
# a kernel package (vmlinuz, cmdline.txt, config.txt in a Go module).
#
#   build.sh WORK_DIR PACKAGE_DIR
#
# The source gets the patches in image/kernel/patches (*.patch, in name
# order) before it is configured.
#
# WORK_DIR keeps the unpacked source tree and object files, so a rebuild
# after a fragment or patch change compiles only what changed. PACKAGE_DIR
# is only rewritten when an input changed: the Debian source package
# version, the stock kernel, config.fragment, the patches or this script
# (their hash is in PACKAGE_DIR/inputs.sha256).
set -euo pipefail

work=${1:?usage: build.sh WORK_DIR PACKAGE_DIR}
pkg=${2:?usage: build.sh WORK_DIR PACKAGE_DIR}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

# Debian's source package; KERNEL_SOURCE_SERIES=6.1 picks the older series.
series=${KERNEL_SOURCE_SERIES:-6.12}
srcpkg=linux-source-$series
tarball=/usr/src/$srcpkg.tar.xz
jobs=${KERNEL_JOBS:-2}
module=github.com/nftgate/kernel.amd64

srcversion=$(dpkg-query -W -f '${Version}' "$srcpkg" 2>/dev/null) || {
	echo "$srcpkg is not installed (make kernel-deps installs it)" >&2
	exit 1
}

# The stock kernel pinned for the image: its configuration (read out of its
# vmlinuz, which carries /proc/config.gz) is the starting point, and its
# cmdline.txt is reused as is.
stockver=$(sed -n 's/^require github.com\/gokrazy\/kernel.amd64 \(v[^ ]*\).*/\1/p' \
	"$repo/image/builddir/github.com/gokrazy/kernel.amd64/go.mod")
[ -n "$stockver" ] || { echo "no github.com/gokrazy/kernel.amd64 version in image/builddir" >&2; exit 1; }
stockdir=$(cd "$repo/image/builddir/github.com/gokrazy/kernel.amd64" &&
	go mod download -json "github.com/gokrazy/kernel.amd64@$stockver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -f "$stockdir/vmlinuz" ] || { echo "stock kernel not found (github.com/gokrazy/kernel.amd64@$stockver)" >&2; exit 1; }

inputs=$( {
	echo "$srcpkg $srcversion"
	echo "stock $stockver"
	sha256sum "$here/config.fragment" "$here/build.sh" "$here"/patches/*.patch | cut -d' ' -f1
} | sha256sum | cut -d' ' -f1)
if [ -f "$pkg/vmlinuz" ] && [ "$(cat "$pkg/inputs.sha256" 2>/dev/null)" = "$inputs" ]; then
	echo "kernel package $pkg is up to date ($srcpkg $srcversion, $(cat "$pkg/release"))"
	exit 0
fi

mkdir -p "$work"
src=$work/$srcpkg
applied=$work/$srcpkg.patches
# unpack replaces the source tree with the tarball's, no patch applied.
unpack() {
	echo "unpacking $tarball ($srcversion)"
	rm -rf "$src" "$work/$srcpkg.version" "$applied"
	tar -C "$work" -xf "$tarball"
	echo "$srcversion" >"$work/$srcpkg.version"
}
if [ "$(cat "$work/$srcpkg.version" 2>/dev/null)" != "$srcversion" ]; then
	unpack
fi

# The patches: copies of those the tree has are kept beside it
# ($srcpkg.patches/); when the patches change, those are taken back out in
# reverse order (only their files are compiled again) and the new ones put
# in. A tree they cannot be taken out of (changed by hand) is unpacked
# again.
if ! diff -rq "$here/patches" "$applied" >/dev/null 2>&1; then
	for p in $(ls -r "$applied"/*.patch 2>/dev/null); do
		patch -d "$src" -p1 -R -s -f --no-backup-if-mismatch <"$p" && continue
		echo "$(basename "$p"), applied before, does not come out of $src"
		unpack
		break
	done
	rm -rf "$applied" "$applied.tmp"
	mkdir -p "$applied.tmp"
	for p in "$here"/patches/*.patch; do
		echo "applying $(basename "$p")"
		if ! patch -d "$src" -p1 -s -f --no-backup-if-mismatch <"$p"; then
			# Half applied: the next build unpacks the source again.
			rm -f "$work/$srcpkg.version"
			echo "$p does not apply to $srcpkg $srcversion" >&2
			exit 1
		fi
		cp "$p" "$applied.tmp/"
	done
	mv "$applied.tmp" "$applied"
fi

"$src/scripts/extract-ikconfig" "$stockdir/vmlinuz" >"$work/stock.config"
# Options the stock kernel builds as modules would be dropped with
# CONFIG_MODULES; the Xen backends (the only ones) are not needed.
(cd "$src" && KCONFIG_CONFIG=.config scripts/kconfig/merge_config.sh -m \
	"$work/stock.config" "$here/config.fragment" >"$work/merge.log")
make -C "$src" -s olddefconfig >>"$work/merge.log"

# Every option of the fragment must have survived olddefconfig: an option
# whose dependencies are missing is silently dropped otherwise. An option
# left out may also vanish with its menu.
missing=0
while IFS= read -r line; do
	case $line in
	CONFIG_*=*)
		grep -qxF -- "$line" "$src/.config" && continue ;;
	"# CONFIG_"*" is not set")
		opt=${line#\# }
		opt=${opt%% *}
		grep -q "^$opt=" "$src/.config" || continue ;;
	*) continue ;;
	esac
	echo "config.fragment: \"$line\" did not survive olddefconfig" >&2
	missing=1
done <"$here/config.fragment"
[ $missing = 0 ] || exit 1

echo "building bzImage from $srcpkg $srcversion with -j$jobs (log: $work/build.log)"
start=$(date +%s)
# Fixed build user, host and time keep the image reproducible.
if ! KBUILD_BUILD_USER=nftgate KBUILD_BUILD_HOST=nftgate \
	KBUILD_BUILD_TIMESTAMP="$(date -u -d "@$(stat -c %Y "$tarball")")" \
	nice -n 10 make -C "$src" -j"$jobs" bzImage >"$work/build.log" 2>&1; then
	tail -40 "$work/build.log" >&2
	exit 1
fi
end=$(date +%s)
release=$(make -C "$src" -s kernelrelease)

tmp=$pkg.tmp
rm -rf "$tmp"
mkdir -p "$tmp"
cp "$src/arch/x86/boot/bzImage" "$tmp/vmlinuz"
cp "$stockdir/cmdline.txt" "$tmp/cmdline.txt"
: >"$tmp/config.txt"
cp "$src/.config" "$tmp/config"
cp "$src/COPYING" "$tmp/COPYING.linux"
echo "$release" >"$tmp/release"
printf 'module %s\n\ngo 1.22\n' "$module" >"$tmp/go.mod"
printf '// Package kernel holds a Linux kernel for gokrazy images; gok reads\n// vmlinuz and cmdline.txt from this directory.\npackage kernel\n' >"$tmp/kernel.go"
echo "$inputs" >"$tmp/inputs.sha256"
rm -rf "$pkg"
mv "$tmp" "$pkg"
echo "kernel package $pkg: Linux $release, compiled in $((end - start)) s"
