#!/usr/bin/env bash
# Builds trainlet's minimal image rootfs without Docker: target/rootfs/trainlet-rootfs.tar
# holds the release binary at /usr/local/bin/trainlet, the glibc libraries it links
# (found with ldd, from this Debian 12 build machine), and passwd/group entries for the
# nonroot user 65532, like distroless cc:nonroot. The tarball is reproducible (sorted,
# owned by root, fixed mtime). Turn it into an image with either of:
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
# (NVML is not among them: it is dlopened at run time from what the NVIDIA container
# runtime mounts.)
ldd "$bin" | awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}' | sort -u | while read -r lib; do
	real=$(readlink -f "$lib")
	mkdir -p "$root$(dirname "$lib")"
	cp "$real" "$root$lib"
done

printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"

tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
	-C "$root" -cf "$out/trainlet-rootfs.tar" .
echo "$out/trainlet-rootfs.tar"
