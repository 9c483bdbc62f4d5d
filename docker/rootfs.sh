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
libs=$(ldd "$bin" | awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}' | sort -u)
libc=$(grep '/libc\.so\.6$' <<<"$libs") || {
	echo "rootfs: $bin does not link glibc's libc.so.6" >&2
	exit 1
}
for nvml_needs in libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1; do
	[ -e "$(dirname "$libc")/$nvml_needs" ] || {
		echo "rootfs: no $nvml_needs beside $libc (NVML needs it)" >&2
		exit 1
	}
	libs+=$'\n'"$(dirname "$libc")/$nvml_needs"
done
sort -u <<<"$libs" | while read -r lib; do
	real=$(readlink -f "$lib")
	mkdir -p "$root$(dirname "$lib")"
	cp "$real" "$root$lib"
done

printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"

tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
	-C "$root" -cf "$out/trainlet-rootfs.tar" .
echo "$out/trainlet-rootfs.tar"
