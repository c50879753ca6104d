#!/usr/bin/env bash
# Builds Kubernetes binaries (kube-apiserver, kube-proxy) from the
# k8s.io/kubernetes Go module at a pinned version, fetched through the Go
# module proxy. Nothing of the Kubernetes source is kept in this repository.
#
# The k8s.io/kubernetes module cannot be built as a plain dependency: its
# go.mod points the k8s.io/* staging modules at ./staging, which module zips do
# not contain. So the module is copied out of the module cache, the ./staging
# replace lines are dropped, every staging module is pinned at the matching
# v0.x release, and the commands are built from that copy.
#
# Built binaries are cached outside the work tree, keyed by Kubernetes version,
# Go version and target platform, so that a fresh clone on the same machine
# (or `make clean`) does not pay the build again. Only the binaries asked for
# and not yet cached are built: the tests need kube-apiserver alone, the
# benchmark kube-proxy too (which then costs its own packages and a link:
# the packages they share are in Go's build cache).
#
# Usage: build.sh -v VERSION -o OUTDIR NAME...   (NAME: kube-apiserver, kube-proxy)
# Environment: NFTGATE_KUBE_CACHE overrides the cache directory.
set -euo pipefail

usage() {
	echo "usage: $0 -v VERSION -o OUTDIR kube-apiserver|kube-proxy..." >&2
	exit 2
}

version=""
outdir=""
while getopts "v:o:" opt; do
	case "$opt" in
	v) version="$OPTARG" ;;
	o) outdir="$OPTARG" ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[[ -n "$version" && -n "$outdir" && $# -gt 0 ]] || usage
if [[ ! "$version" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]; then
	echo "$0: version $version: want v1.MINOR.PATCH" >&2
	exit 2
fi
# Staging modules are tagged v0.MINOR.PATCH for Kubernetes v1.MINOR.PATCH.
staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"

# Every binary this script knows how to build.
all_cmds=(kube-apiserver kube-proxy)
for name in "$@"; do
	case " ${all_cmds[*]} " in
	*" $name "*) ;;
	*)
		echo "$0: unknown binary $name (known: ${all_cmds[*]})" >&2
		exit 2
		;;
	esac
done

go=${GO:-go}
goversion=$($go env GOVERSION)
goos=$($go env GOOS)
goarch=$($go env GOARCH)

default_cache_root() {
	if [[ -d /var/cache && -w /var/cache ]] || [[ -d /var/cache/nftgate && -w /var/cache/nftgate ]]; then
		echo /var/cache/nftgate/kube
	else
		echo "${XDG_CACHE_HOME:-$HOME/.cache}/nftgate/kube"
	fi
}
cache_root=${NFTGATE_KUBE_CACHE:-$(default_cache_root)}
cache="$cache_root/$version-$goversion-$goos-$goarch"
mkdir -p "$cache"

# build_into_cache NAME...: builds the named commands into the cache.
build_into_cache() {
	local work moddir start end
	work=$(mktemp -d "$cache_root/build.XXXXXX")
	# shellcheck disable=SC2064 # expand $work now: it is local
	trap "chmod -R u+w '$work' 2>/dev/null; rm -rf '$work'" EXIT

	echo "kube: fetching k8s.io/kubernetes@$version through the module proxy"
	moddir=$(cd "$work" && GOFLAGS=-mod=mod $go mod download -json "k8s.io/kubernetes@$version" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	if [[ -z "$moddir" || ! -d "$moddir" ]]; then
		echo "$0: k8s.io/kubernetes@$version is not available from the module proxy" >&2
		exit 1
	fi
	cp -r "$moddir" "$work/src"
	chmod -R u+w "$work/src"

	cd "$work/src"
	# The module ships a go.work that lists ./staging too, and what is left
	# of vendor/ (modules.txt) no longer matches the edited go.mod.
	rm -rf go.work go.work.sum vendor
	export GOWORK=off
	# Drop the replace block entries that point into ./staging, then pin each
	# staging module (required as v0.0.0) at its published release.
	local staging=() m
	mapfile -t staging < <(sed -n 's/^[[:space:]]*\(k8s\.io\/[^[:space:]]*\) => \.\/staging\/.*/\1/p' go.mod)
	if [[ ${#staging[@]} -eq 0 ]]; then
		echo "$0: no ./staging replace lines found in k8s.io/kubernetes@$version go.mod" >&2
		exit 1
	fi
	local edits=()
	for m in "${staging[@]}"; do
		edits+=("-dropreplace=$m")
		# Only modules the main module requires get a version; the sample
		# modules are replaced but not required.
		if grep -qE "^[[:space:]]*$m v0\.0\.0\$" go.mod; then
			edits+=("-require=$m@$staging_version")
		fi
	done
	$go mod edit "${edits[@]}"

	start=$(date +%s)
	# -mod=mod resolves and downloads only what the named commands import
	# (the module's go.mod already pins every dependency; the staging modules'
	# sums are added). `go mod tidy` would also fetch every test dependency of
	# the whole module; the binaries come out the same byte for byte.
	echo "kube: building $* (Kubernetes $version, staging $staging_version, $goversion)"
	local pkgs=()
	for m in "$@"; do
		pkgs+=("./cmd/$m")
	done
	# -trimpath and no VCS stamping: the output depends only on the pinned
	# inputs. The version is stamped the way the Kubernetes build does, so
	# that `--version` and /version report it.
	local ldflags="-s -w"
	ldflags+=" -X k8s.io/component-base/version.gitVersion=$version"
	ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
	ldflags+=" -X k8s.io/component-base/version.gitMinor=${BASH_REMATCH[1]}"
	ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
	ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$version"
	CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod" $go build -trimpath -ldflags "$ldflags" -o "$work/bin/" "${pkgs[@]}"
	end=$(date +%s)
	echo "kube: built in $((end - start)) s"
	for m in "$@"; do
		mv -f "$work/bin/$m" "$cache/$m"
		echo "$m $version $goversion $((end - start))s" >>"$cache/BUILDINFO"
	done
}

# Serialize concurrent builds (make -j, parallel clones) on the same cache.
exec 9>"$cache/.lock"
flock 9
missing=()
for name in "$@"; do
	[[ -x "$cache/$name" ]] || missing+=("$name")
done
if [[ ${#missing[@]} -gt 0 ]]; then
	# Re-read BASH_REMATCH for the minor version used in the ldflags.
	[[ "$version" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]
	(build_into_cache "${missing[@]}")
else
	echo "kube: using cached $* from $cache"
fi

mkdir -p "$outdir"
for name in "$@"; do
	# Copy to a temporary name first so that a reader never sees a partial
	# binary in the output directory.
	install -m 0755 "$cache/$name" "$outdir/.$name.tmp"
	mv -f "$outdir/.$name.tmp" "$outdir/$name"
done
