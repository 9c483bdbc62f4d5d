#!/usr/bin/env bash
# `make release`: what a release of trainlet publishes, from the two portable binaries
# (x86_64 and aarch64, glibc 2.17; `make portable portable-arm64`), into
# target/release-artifacts/ (or $TRAINLET_RELEASE_DIR):
#
#   trainlet-<v>-linux-amd64.tar.gz, trainlet-<v>-linux-arm64.tar.gz
#       the binary with README.md and LICENSE, for `trainlet init --install-to` users and
#       anyone who runs it outside a container;
#   trainlet-<v>.oci.tar
#       one OCI image index holding linux/amd64 and linux/arm64, as an OCI archive:
#       `skopeo copy --all oci-archive:trainlet-<v>.oci.tar docker://REGISTRY/trainlet:<v>`
#       publishes both platforms under one name;
#   trainlet-<v>-linux-amd64.docker.tar, trainlet-<v>-linux-arm64.docker.tar
#       each platform's image as a docker-archive tagged ghcr.io/trainlet/trainlet:<v>,
#       for `kind load image-archive`, `ctr -n k8s.io images import`, `docker load`;
#   install.yaml
#       the Helm chart's defaults, the objects of manifests/ (the RBAC, the guard, the
#       admission policy and its parameter object), the image pinned by the index's digest;
#   trainlet-<v>-linux-amd64.cdx.json, trainlet-<v>-linux-arm64.cdx.json
#       the CycloneDX SBOM of each binary's Rust dependencies (cargo-cyclonedx);
#   SHA256SUMS
#       of all the above, for `sha256sum -c`.
#
# Reproducible: the same binaries and sources give byte-identical artifacts, so the same
# digests. Tarballs are sorted, owned by root and dated at the Unix epoch, gzip stores no
# name or time, the images are docker/mkimage.sh's (reproducible), and the SBOM loses its
# two fields that change on every run (the time it was made and a random serial number:
# cargo-cyclonedx has no option for this, CycloneDX/cyclonedx-rust-cargo issue 514).
#
# Usage: docker/release.sh AMD64_BINARY ARM64_BINARY   Prints the directory last.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf 'release: %s\n' "$*" >&2; }
fail() {
	printf 'release: step "%s" failed: %s\n' "$1" "$2" >&2
	exit 1
}

[ $# -eq 2 ] || fail usage "docker/release.sh AMD64_BINARY ARM64_BINARY"
declare -A bins=([amd64]=$1 [arm64]=$2)
for arch in amd64 arm64; do
	[ -x "${bins[$arch]}" ] || fail binary "no executable at ${bins[$arch]} for linux/$arch (make portable portable-arm64)"
done
for tool in cargo-cyclonedx gzip python3; do
	command -v "$tool" >/dev/null || fail tools "no '$tool' on PATH (.ci/deps installs it)"
done
version=$(sed -n 's/^ARG VERSION=\(.*\)$/\1/p' docker/Dockerfile | tail -n 1)
[ -n "$version" ] || fail version "no ARG VERSION=... in docker/Dockerfile"
repository=ghcr.io/trainlet/trainlet

out=${TRAINLET_RELEASE_DIR:-target/release-artifacts}
rm -rf "$out"
mkdir -p "$out"
work=$(mktemp -d "$out.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A tar of DIR's contents that depends on nothing but their names, bytes and modes.
reproducible_tar() {
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -C "$1" -cf - .
}

for arch in amd64 arm64; do
	step "linux/$arch: tarball"
	stage=$work/tar-$arch
	mkdir -p "$stage"
	install -m 0755 "${bins[$arch]}" "$stage/trainlet"
	install -m 0644 README.md LICENSE "$stage/"
	reproducible_tar "$stage" | gzip -9 -n >"$out/trainlet-$version-linux-$arch.tar.gz"

	step "linux/$arch: image (docker/image.sh)"
	TRAINLET_OCI_LAYOUT=$work/oci-$arch docker/image.sh "${bins[$arch]}" \
		"$out/trainlet-$version-linux-$arch.docker.tar" >/dev/null 2>"$work/image-$arch.log" ||
		fail "image $arch" "$(tail -n 3 "$work/image-$arch.log" | tr '\n' ' ')"
done

step "the image index of linux/amd64 and linux/arm64"
# One OCI layout holding both platforms' blobs, its index.json naming one image index
# (tag <version>) whose manifests carry their platform: what `skopeo copy --all` and a
# registry serve to `docker pull` and the kubelet, which pick their own platform.
index_digest=$(
	python3 - "$work/index" "$version" "$work/oci-amd64" "$work/oci-arm64" <<'EOF'
import hashlib, json, os, shutil, sys

dest, version, layouts = sys.argv[1], sys.argv[2], sys.argv[3:]
INDEX = "application/vnd.oci.image.index.v1+json"
blobs = os.path.join(dest, "blobs", "sha256")
os.makedirs(blobs)

def write_blob(data):
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest, len(data)

def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

manifests = []
for layout in layouts:
    [entry] = json.load(open(os.path.join(layout, "index.json")))["manifests"]
    for name in sorted(os.listdir(os.path.join(layout, "blobs", "sha256"))):
        shutil.copyfile(os.path.join(layout, "blobs", "sha256", name), os.path.join(blobs, name))
    manifest = json.load(open(os.path.join(blobs, entry["digest"].split(":", 1)[1])))
    config = json.load(open(os.path.join(blobs, manifest["config"]["digest"].split(":", 1)[1])))
    manifests.append({
        "mediaType": entry["mediaType"],
        "digest": entry["digest"],
        "size": entry["size"],
        "platform": {"architecture": config["architecture"], "os": config["os"]},
    })
digest, size = write_blob(canonical({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}))
with open(os.path.join(dest, "index.json"), "wb") as f:
    f.write(canonical({"schemaVersion": 2, "mediaType": INDEX, "manifests": [{
        "mediaType": INDEX, "digest": digest, "size": size,
        "annotations": {"org.opencontainers.image.ref.name": version},
    }]}))
with open(os.path.join(dest, "oci-layout"), "w") as f:
    f.write('{"imageLayoutVersion":"1.0.0"}')
print(digest)
EOF
) || fail index "could not join the two platforms' layouts"
reproducible_tar "$work/index" >"$out/trainlet-$version.oci.tar"
image=$repository@$index_digest
step "$repository:$version is $image"

step "install.yaml: the Helm chart's defaults with $image"
# The chart's objects with its defaults, which a test keeps equal to manifests/: trainlet's
# RBAC in the namespace `default` (other namespaces of jobs: `kubectl apply -k manifests/
# -n NS`), the guard, the admission policy and its parameter object, whose `image` is the
# one value set. Rendered by Helm (built once from its Go module, tests/helm/build), which
# keeps the policies' CEL as written: kustomize re-folds block scalars.
helm=$(tests/helm/build 2>"$work/helm.log") || fail helm "$(tail -n 3 "$work/helm.log" | tr '\n' ' ')"
"$helm" template trainlet charts/trainlet --set "image=$image" >"$work/install.yaml" 2>"$work/helm.log" ||
	fail install.yaml "$(grep -v 'found symbolic link' "$work/helm.log" | tail -n 3 | tr '\n' ' ')"
{
	echo "# trainlet $version: kubectl apply --server-side -f install.yaml (docs/install.md)."
	echo "# trainlet's RBAC is in the namespace default; for the jobs of another namespace:"
	echo "# kubectl apply -k manifests/ -n NAMESPACE, or the Helm chart's namespaces value."
	cat "$work/install.yaml"
} >"$out/install.yaml"

# One SBOM a platform: the two depend on different crates (core_detect is x86_64's
# alone). cargo-cyclonedx writes beside Cargo.toml, under a name of its own.
declare -A triples=([amd64]=x86_64-unknown-linux-gnu [arm64]=aarch64-unknown-linux-gnu)
sbom=trainlet-release-sbom
trap 'rm -rf "$work" "$sbom.json"' EXIT
for arch in amd64 arm64; do
	step "linux/$arch: SBOM (cargo-cyclonedx)"
	cargo cyclonedx --format json --spec-version 1.5 --override-filename "$sbom" \
		--target "${triples[$arch]}" >"$work/cyclonedx.log" 2>&1 ||
		fail sbom "$(tail -n 3 "$work/cyclonedx.log" | tr '\n' ' ')"
	python3 - "$sbom.json" "$out/trainlet-$version-linux-$arch.cdx.json" <<'EOF' ||
import json, os, sys

src, dest = sys.argv[1], sys.argv[2]
bom = json.load(open(src))
os.remove(src)
bom.pop("serialNumber", None)
bom.get("metadata", {}).pop("timestamp", None)
with open(dest, "w") as f:
    json.dump(bom, f, indent=2, sort_keys=True)
    f.write("\n")
EOF
		fail sbom "could not make the SBOM reproducible"
done

(cd "$out" && sha256sum -- *.tar.gz *.tar install.yaml *.cdx.json >SHA256SUMS)
step "$(wc -l <"$out/SHA256SUMS") artifacts in $out"
echo "$out"
