#!/usr/bin/env bash
# Turns a root filesystem tarball into a container image archive, without a Docker daemon
# and without hand-written JSON: umoci builds an OCI image layout (one layer, the tarball
# verbatim; the config from umoci's --config.* options), skopeo writes it out as a
# `docker-archive`, the `docker save` format.
#
# Why docker-archive: it is the one format that every loader takes: `docker load` (every
# version; the OCI layout only since Docker 25), `podman load`, `kind load image-archive`
# (which pipes it to `ctr images import` in the node) and `ctr images import` (containerd
# reads manifest.json and the RepoTags in it, symlinks included). It stores layers
# uncompressed, so the layer digests in it are the image's diff IDs.
#
# Reproducible: given the same rootfs tarball and options, the image (manifest, config,
# layer) and the archive are byte-for-byte the same. The config's `created` and the one
# history entry's are fixed at the Unix epoch (the same as the rootfs tarball's mtimes),
# and skopeo writes the archive's members in a fixed order with mtime 0.
#
# With MKIMAGE_OCI_LAYOUT=DIR, the OCI image layout is kept in DIR as well, the image
# tagged MKIMAGE_TAG (default: NAME's tag) there.
#
# Usage: docker/mkimage.sh ROOTFS.tar NAME:TAG OUT.tar [umoci config options...]
#   e.g. docker/mkimage.sh rootfs.tar example.test/x:1 x.tar --config.entrypoint /x
# Prints the image's digests on stderr and OUT.tar as its last line.
set -euo pipefail

step() { printf 'mkimage: %s\n' "$*" >&2; }
fail() {
	printf 'mkimage: step "%s" failed: %s\n' "$1" "$2" >&2
	exit 1
}

[ $# -ge 3 ] || fail usage "docker/mkimage.sh ROOTFS.tar NAME:TAG OUT.tar [umoci config options...]"
rootfs=$1 name=$2 out=$3
shift 3
[ -f "$rootfs" ] || fail rootfs "no such file: $rootfs"
# The CRI normalises a name without a registry (local/x:1 becomes docker.io/local/x:1)
# and then tries to pull it: only a fully qualified name finds an imported image.
registry=${name%%/*}
[[ $name == */* && ($registry == *.* || $registry == *:* || $registry == localhost) ]] ||
	fail name "$name is not fully qualified (registry/name:tag)"
for tool in umoci skopeo; do
	command -v "$tool" >/dev/null || fail tools "no '$tool' on PATH (Debian package $tool; .ci/deps installs it)"
done

epoch=1970-01-01T00:00:00Z
mkdir -p "$(dirname "$out")"
work=$(mktemp -d "$out.XXXXXX")
trap 'rm -rf "$work"' EXIT
layout=$work/oci

step "building $name from $rootfs"
{
	umoci init --layout "$layout"
	umoci new --image "$layout:image"
	# The tarball goes in verbatim (umoci compresses it): its order, owners and mtimes
	# are what the caller made reproducible. One history entry, with a fixed time, so
	# that tools listing a layer's history find one.
	umoci raw add-layer --image "$layout:image" \
		--history.created "$epoch" --history.created_by "docker/mkimage.sh $(basename "$rootfs")" "$rootfs"
	umoci config --image "$layout:image" --no-history --created "$epoch" "$@"
	umoci gc --layout "$layout"
} >"$work/umoci.log" 2>&1 || fail umoci "$(tail -n 3 "$work/umoci.log" | tr '\n' ' ')"

skopeo copy --quiet "oci:$layout:image" "docker-archive:$work/image.tar:$name" >"$work/skopeo.log" 2>&1 ||
	fail skopeo "$(tail -n 3 "$work/skopeo.log" | tr '\n' ' ')"
mv -f "$work/image.tar" "$out"

if [ -n "${MKIMAGE_OCI_LAYOUT:-}" ]; then
	# The same manifest, config and layer blobs, under the tag asked for.
	rm -rf "$MKIMAGE_OCI_LAYOUT"
	mkdir -p "$(dirname "$MKIMAGE_OCI_LAYOUT")"
	cp -r "$layout" "$MKIMAGE_OCI_LAYOUT"
	{
		umoci tag --image "$MKIMAGE_OCI_LAYOUT:image" "${MKIMAGE_TAG:-${name##*:}}"
		umoci rm --image "$MKIMAGE_OCI_LAYOUT:image"
	} >"$work/umoci.log" 2>&1 || fail layout "$(tail -n 3 "$work/umoci.log" | tr '\n' ' ')"
fi

manifest=$(skopeo inspect --raw "oci:$layout:image" | sha256sum | cut -d' ' -f1)
config=$(skopeo inspect --config --raw "oci:$layout:image" | sha256sum | cut -d' ' -f1)
step "$name: OCI manifest sha256:$manifest, config (image ID) sha256:$config"
step "$out: sha256:$(sha256sum "$out" | cut -d' ' -f1), $(du -h "$out" | cut -f1)"
echo "$out"
