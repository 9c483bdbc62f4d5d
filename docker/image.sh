#!/usr/bin/env bash
# Builds trainlet's image without a Docker daemon: target/image/trainlet-<version>.tar, a
# `docker-archive` tagged ghcr.io/trainlet/trainlet:<version> (what the manifests run),
# for `docker load`, `podman load`, `kind load image-archive` or
# `ctr -n k8s.io images import` (see docker/mkimage.sh for why this format).
#
# The filesystem is docker/rootfs.sh's (the binary at /usr/local/bin/trainlet, the glibc
# libraries it links, passwd/group for 65532). The config is read from the final stage of
# docker/Dockerfile, so the two cannot drift: its LABELs, ENV, USER, ENTRYPOINT, CMD and
# the VERSION argument (the tag). Any other instruction there stops this script: it would
# have to learn it. Two differences from what `docker build` makes, both deliberate:
# - There is no distroless base under the binary, so the label
#   org.opencontainers.image.base.name is left out (it would name a base that is not
#   there). PATH is set as in distroless (and Docker's default), since the base's
#   config is not inherited.
# - The one layer and the config carry fixed times, so the same binary gives the same
#   image digest and the same archive bytes.
#
# The image's platform is the binary's: linux/amd64 for an x86_64 binary, linux/arm64 for
# an aarch64 one (docker/rootfs.sh takes its glibc from Debian's cross packages).
#
# Usage: docker/image.sh [BINARY [OUT.tar]]   (default: target/release/trainlet, written
# to target/image/trainlet-<version>.tar; `make image` builds the portable binary first).
# With TRAINLET_OCI_LAYOUT=DIR, the image's OCI layout is kept there too (tag <version>;
# docker/release.sh joins the platforms' into one index). Prints the archive's path as
# its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf 'image: %s\n' "$*" >&2; }
fail() {
	printf 'image: step "%s" failed: %s\n' "$1" "$2" >&2
	exit 1
}

bin=${1:-target/release/trainlet}
[ -x "$bin" ] || fail binary "no executable at $bin (run 'make release', or pass a binary)"
out=target/image

# The final stage of the Dockerfile as umoci config options, one per line; the first
# line is the version (the tag).
config=$(
	python3 - docker/Dockerfile <<'EOF'
import json, re, shlex, sys

text = open(sys.argv[1]).read()
# Join continuation lines, drop comments and blank lines.
lines = []
for raw in re.sub(r"\\\n", " ", text).splitlines():
    raw = raw.strip()
    if raw and not raw.startswith("#"):
        lines.append(raw)
stages = [i for i, l in enumerate(lines) if l.split()[0].upper() == "FROM"]
final = lines[stages[-1] + 1:]
args, opts, version = {}, [], None

def expand(s):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], s)

for line in final:
    instr, _, rest = line.partition(" ")
    instr = instr.upper()
    if instr == "ARG":
        k, _, v = rest.strip().partition("=")
        args[k] = v
    elif instr == "LABEL":
        for kv in shlex.split(rest):
            k, _, v = kv.partition("=")
            # There is no base image under this one (see the header of docker/image.sh).
            if k != "org.opencontainers.image.base.name":
                opts.append("--config.label=%s=%s" % (k, expand(v)))
    elif instr == "ENV":
        for kv in shlex.split(rest):
            opts.append("--config.env=" + expand(kv))
    elif instr == "USER":
        opts.append("--config.user=" + expand(rest.strip()))
    elif instr in ("ENTRYPOINT", "CMD"):
        # Only the exec (JSON) form: the shell form would need a shell in the image.
        for a in json.loads(rest):
            opts.append("--config.%s=%s" % (instr.lower(), a))
    elif instr == "COPY":
        pass  # the filesystem: docker/rootfs.sh
    else:
        sys.exit("docker/image.sh does not handle %s in docker/Dockerfile's final stage" % instr)
if "VERSION" not in args:
    sys.exit("no ARG VERSION=... in docker/Dockerfile's final stage")
print(args["VERSION"])
print("--config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
print("\n".join(opts))
EOF
) || fail dockerfile "could not read the final stage of docker/Dockerfile"
mapfile -t opts <<<"$config"
version=${opts[0]}
opts=("${opts[@]:1}")
name=ghcr.io/trainlet/trainlet:$version

archive=${2:-$out/trainlet-$version.tar}
case "$(readelf -h "$bin" | awk -F: '/Machine:/{print $2}')" in
*AArch64) arch=arm64 ;;
*X86-64) arch=amd64 ;;
*) fail platform "$bin is neither an x86_64 nor an aarch64 binary" ;;
esac

step "filesystem of $bin (docker/rootfs.sh), linux/$arch"
rootfs=$(TRAINLET_ROOTFS_DIR=$out/rootfs-$arch docker/rootfs.sh "$bin" | tail -n 1)
MKIMAGE_OCI_LAYOUT=${TRAINLET_OCI_LAYOUT:-} MKIMAGE_TAG=$version \
	docker/mkimage.sh "$rootfs" "$name" "$archive" --os=linux --architecture="$arch" "${opts[@]}" | tail -n 1
