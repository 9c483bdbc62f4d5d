#!/usr/bin/env bash
# Builds trainlet's minimal image rootfs without Docker: target/rootfs/trainlet-rootfs.tar
# holds the binary at /usr/local/bin/trainlet, the glibc libraries it links (found with
# ldd, from this Debian 12 build machine) and those NVML links, and passwd/group entries
# for the nonroot user 65532, like distroless cc:nonroot. The tarball is reproducible
# (sorted, owned by root, fixed mtime). `make rootfs` and `make image` pass the portable
# binary (`make portable`: glibc 2.17 symbols, so it also runs where init --install-to
# copies it). Turn it into an image with either of:
#
#   docker import --change 'USER 65532:65532' \
#     --change 'ENTRYPOINT ["/usr/local/bin/trainlet"]' \
#     --change 'ENV NVIDIA_DRIVER_CAPABILITIES=utility' \
#     target/rootfs/trainlet-rootfs.tar ghcr.io/trainlet/trainlet:0.1.0
#   podman import (the same --change flags)
#
# Usage: docker/rootfs.sh [BINARY]   (default: target/release/trainlet, built if missing;
# the output directory is $TRAINLET_ROOTFS_DIR, default target/rootfs)
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-target/release/trainlet}
if [ ! -x "$bin" ]; then
	cargo build --release --locked --bin trainlet
fi
out=${TRAINLET_ROOTFS_DIR:-target/rootfs}
root=$out/root
rm -rf "$root"
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp"
chmod 1777 "$root/tmp"
install -m 0755 "$bin" "$root/usr/local/bin/trainlet"

# Every shared library the binary links, at the same path, plus the dynamic loader.
# NVML is not among them: it is dlopened at run time from what the NVIDIA container
# runtime mounts, and it links libc, libm, libpthread, libdl and librt (the driver's
# libnvidia-ml.so.1 lists all five as NEEDED). Those the binary does not link itself
# come from the same glibc, beside its libc: without libm.so.6, dlopen fails and the
# sidecar reports NVML unavailable on a node full of GPUs. (distroless cc, the base of
# docker/Dockerfile, ships the whole of glibc.)
#
# A binary of this machine's architecture takes them from this machine (ldd). An aarch64
# binary on an x86_64 machine takes them from Debian's cross glibc (libc6-arm64-cross,
# .ci/deps installs it), placed where Debian's arm64 glibc has them: its loader at the
# binary's PT_INTERP, the libraries in /lib/aarch64-linux-gnu, which that loader searches
# by default (no ld.so.cache is needed).
machine=$(readelf -h "$bin" | awk -F: '/Machine:/{gsub(/^ +/, "", $2); print $2}')
case "$machine" in
AArch64) elf_arch=aarch64 ;;
*X86-64) elf_arch=x86_64 ;;
*)
	echo "rootfs: $bin is a binary for '$machine', which this script does not know" >&2
	exit 1
	;;
esac
if [ "$elf_arch" = "$(uname -m)" ]; then
	libs=$(ldd "$bin" | awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}' | sort -u)
else
	sysroot=/usr/$elf_arch-linux-gnu/lib
	[ -f "$sysroot/libc.so.6" ] || {
		echo "rootfs: no $elf_arch glibc at $sysroot (Debian package libc6-arm64-cross; .ci/deps installs it)" >&2
		exit 1
	}
	interp=$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
	[ -n "$interp" ] || {
		echo "rootfs: $bin names no program interpreter" >&2
		exit 1
	}
	mkdir -p "$root$(dirname "$interp")"
	cp "$(readlink -f "$sysroot/$(basename "$interp")")" "$root$interp"
	libs=""
	for needed in $(readelf -d "$bin" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
		[ -f "$sysroot/$needed" ] || {
			echo "rootfs: $bin needs $needed, which is not in $sysroot" >&2
			exit 1
		}
		libs+="/lib/$elf_arch-linux-gnu/$needed"$'\n'
	done
fi
libc=$(grep '/libc\.so\.6$' <<<"$libs") || {
	echo "rootfs: $bin does not link glibc's libc.so.6" >&2
	exit 1
}
for nvml_needs in libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1; do
	from=${sysroot:-$(dirname "$libc")}
	[ -e "$from/$nvml_needs" ] || {
		echo "rootfs: no $nvml_needs in $from, beside libc.so.6 (NVML needs it)" >&2
		exit 1
	}
	libs+=$'\n'"$(dirname "$libc")/$nvml_needs"
done
sort -u <<<"$libs" | while read -r lib; do
	[ -n "$lib" ] || continue
	if [ -n "${sysroot:-}" ]; then
		real=$(readlink -f "$sysroot/$(basename "$lib")")
	else
		real=$(readlink -f "$lib")
	fi
	mkdir -p "$root$(dirname "$lib")"
	cp "$real" "$root$lib"
done

printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"

tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
	-C "$root" -cf "$out/trainlet-rootfs.tar" .
echo "$out/trainlet-rootfs.tar"
