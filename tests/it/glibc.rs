//! The portable binary: what `make portable` builds (cargo zigbuild, target
//! x86_64-unknown-linux-gnu.2.17), what the image ships, and so what
//! `trainlet init --install-to` copies into the training container, whose image may have
//! any glibc from 2.17 on (Ubuntu 20.04: 2.31, RHEL 8: 2.28, Amazon Linux 2: 2.26).
//! - its dynamic symbols ask for no glibc newer than 2.17, it needs only glibc's own
//!   libraries and the standard loader;
//! - it runs, and loads NVML with dlopen: a fake NVML that links what the driver's
//!   libnvidia-ml.so.1 links (libpthread, libm, libdl, libc, librt);
//! - in the image's root filesystem (docker/rootfs.sh, root only: chroot), as the
//!   nonroot user, it loads that NVML: the rootfs carries the glibc libraries NVML needs.
//!
//! `make test` builds the binary first (`make portable`); without it these tests fail,
//! or are skipped where `TRAINLET_TEST_SKIP` names `portable`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::support::*;

/// The portable binary in this build's target directory (beside the `debug/` that holds
/// the test's own binary), if `make portable` has built it (group `portable`).
pub(crate) fn portable() -> Result<PathBuf, Missing> {
    portable_for("x86_64-unknown-linux-gnu", "make portable")
}

/// The aarch64 one, if `make portable-arm64` has built it.
pub(crate) fn portable_arm64() -> Result<PathBuf, Missing> {
    portable_for("aarch64-unknown-linux-gnu", "make portable-arm64")
}

fn portable_for(triple: &str, make: &str) -> Result<PathBuf, Missing> {
    let target = Path::new(env!("CARGO_BIN_EXE_trainlet"))
        .parent()
        .and_then(Path::parent)
        .expect("the target directory");
    let bin = target.join(triple).join("release/trainlet");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(Missing::new(
            Group::Portable,
            format!(
                "no portable binary at {} (run `{make}`; `make test` does)",
                bin.display()
            ),
        ))
    }
}

/// The aarch64 glibc that QEMU's user-mode emulation runs an arm64 binary on here
/// (`qemu-aarch64 -L`): Debian's cross packages, which `.ci/deps` installs.
pub(crate) const ARM64_SYSROOT: &str = "/usr/aarch64-linux-gnu";

fn tool(cmd: &str, args: &[&str], file: &Path) -> String {
    let out = Command::new(cmd)
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} (binutils) is not installed: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The newest `GLIBC_x.y[.z]` version among a binary's dynamic symbols, as numbers.
fn newest_glibc(bin: &Path) -> Vec<u32> {
    let symbols = tool("objdump", &["-T"], bin);
    symbols
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            v.split('.')
                .map(|n| n.parse().ok())
                .collect::<Option<Vec<u32>>>()
        })
        .max()
        .unwrap_or_else(|| panic!("no GLIBC_ symbol versions in {}", bin.display()))
}

/// The libraries a binary names as NEEDED, in order.
fn needed(bin: &Path) -> Vec<String> {
    tool("objdump", &["-p"], bin)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("NEEDED"))
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn the_portable_binary_needs_glibc_2_17_at_most() {
    let bin = require!(portable());
    let newest = newest_glibc(&bin);
    assert!(
        newest <= vec![2, 17],
        "{} asks for GLIBC_{}: it would not start on glibc 2.17",
        bin.display(),
        newest
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(".")
    );
    // glibc's own libraries only (no libgcc_s: panics abort, and Zig links its unwinder),
    // and the loader every x86_64 glibc distribution has at this path.
    assert_eq!(needed(&bin), ["libc.so.6", "libpthread.so.0", "libdl.so.2"]);
    assert!(
        tool("readelf", &["-l"], &bin)
            .contains("[Requesting program interpreter: /lib64/ld-linux-x86-64.so.2]")
    );

    // A check that can fail: the test's own binary, linked on this Debian 12 machine,
    // asks for a newer glibc.
    let host = newest_glibc(Path::new(env!("CARGO_BIN_EXE_trainlet")));
    assert!(host > vec![2, 17], "{host:?}");
}

/// The same for arm64 (Grace: GH200, GB200): glibc 2.17 at most (the oldest aarch64
/// distributions have it), glibc's own libraries, aarch64's standard loader, and it runs
/// under QEMU's user-mode emulation on that glibc.
#[test]
fn the_arm64_portable_binary_needs_glibc_2_17_at_most_and_runs() {
    let bin = require!(portable_arm64());
    require!(on_path(
        Group::Deps,
        "qemu-aarch64",
        "Debian package qemu-user"
    ));
    assert!(tool("readelf", &["-h"], &bin).contains("AArch64"));
    assert!(newest_glibc(&bin) <= vec![2, 17], "{}", bin.display());
    assert_eq!(needed(&bin), ["libc.so.6", "libpthread.so.0", "libdl.so.2"]);
    assert!(
        tool("readelf", &["-l"], &bin)
            .contains("[Requesting program interpreter: /lib/ld-linux-aarch64.so.1]")
    );
    let version = stdout_of(
        Command::new("qemu-aarch64")
            .args(["-L", ARM64_SYSROOT])
            .arg(&bin)
            .arg("--version"),
    );
    assert_eq!(version, format!("trainlet {}\n", env!("CARGO_PKG_VERSION")));
}

/// A fake NVML that links what the driver's libnvidia-ml.so.1 links, in its order
/// (libpthread.so.0, libm.so.6, libdl.so.2, libc.so.6, librt.so.1, as `objdump -p` lists
/// them for driver 580): since glibc 2.34 `-lpthread`, `-ldl` and `-lrt` name empty
/// archives, so the shared objects are named by file.
fn nvml_like_the_driver() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let lib = dir.join("libnvidia-ml.so.1");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(repo().join("tests/fixtures/fake_nvml.c"))
            .args([
                "-Wl,--no-as-needed",
                "-l:libpthread.so.0",
                "-lm",
                "-l:libdl.so.2",
                "-lc",
                "-l:librt.so.1",
            ])
            .output()
            .expect("cc is installed");
        assert!(
            out.status.success(),
            "cc fake_nvml.c: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            needed(&lib),
            [
                "libpthread.so.0",
                "libm.so.6",
                "libdl.so.2",
                "libc.so.6",
                "librt.so.1"
            ]
        );
        lib
    })
}

fn stdout_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// What `trainlet gpus` prints for the fake NVML with two devices.
fn two_fake_gpus() -> Value {
    json!({
        "GPU": 2,
        "devices": [
            {"index": 0, "uuid": "GPU-00000000-fake-0000", "name": "Fake GPU", "memory_total_bytes": 17179869184u64},
            {"index": 1, "uuid": "GPU-00000000-fake-0001", "name": "Fake GPU", "memory_total_bytes": 17179869184u64},
        ],
        "driver_version": "550.54.15",
        "nvml": "ok",
    })
}

#[test]
fn the_portable_binary_runs_and_loads_nvml() {
    let bin = require!(portable());
    let version = Command::new(&bin).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        format!("trainlet {}\n", env!("CARGO_PKG_VERSION"))
    );

    let lib = nvml_like_the_driver();
    let gpus = Command::new(&bin)
        .args(["gpus", "--nvml-lib"])
        .arg(lib)
        .env("FAKE_NVML_COUNT", "2")
        .output()
        .unwrap();
    assert_eq!(stdout_json(&gpus), two_fake_gpus());

    // Without NVML it says why, and still exits 0.
    let missing = Command::new(&bin)
        .args(["gpus", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .output()
        .unwrap();
    assert_eq!(
        stdout_json(&missing),
        json!({
            "GPU": 0,
            "devices": [],
            "driver_version": null,
            "nvml": "unavailable: library /nonexistent/libnvidia-ml.so.1 not found (/nonexistent/libnvidia-ml.so.1: cannot open shared object file: No such file or directory)",
        })
    );
}

/// The image's filesystem (docker/rootfs.sh, as `make image` builds it) with the
/// portable binary, and an NVML where the NVIDIA container runtime mounts it: as the
/// nonroot user, `trainlet gpus` loads it. NVML's libraries (libm, librt...) are not the
/// binary's, so only the rootfs's own copies can satisfy them.
#[test]
fn the_image_rootfs_loads_nvml_as_nonroot() {
    let bin = require!(portable());
    // chroot needs root; CI runs as root.
    require!(root(Group::Root, "chroot into the rootfs"));
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(repo().join("docker/rootfs.sh"))
        .arg(&bin)
        .env("TRAINLET_ROOTFS_DIR", dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing = Command::new("tar")
        .arg("tf")
        .arg(dir.path().join("trainlet-rootfs.tar"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&listing.stdout),
        "./\n./etc/\n./etc/group\n./etc/passwd\n./lib/\n./lib/x86_64-linux-gnu/\n\
         ./lib/x86_64-linux-gnu/libc.so.6\n./lib/x86_64-linux-gnu/libdl.so.2\n\
         ./lib/x86_64-linux-gnu/libm.so.6\n./lib/x86_64-linux-gnu/libpthread.so.0\n\
         ./lib/x86_64-linux-gnu/librt.so.1\n./lib64/\n./lib64/ld-linux-x86-64.so.2\n\
         ./tmp/\n./usr/\n./usr/local/\n./usr/local/bin/\n./usr/local/bin/trainlet\n"
    );

    let root = dir.path().join("root");
    let nvml_dir = root.join("usr/local/nvidia/lib64");
    std::fs::create_dir_all(&nvml_dir).unwrap();
    std::fs::copy(nvml_like_the_driver(), nvml_dir.join("libnvidia-ml.so.1")).unwrap();
    let gpus = Command::new("chroot")
        .arg("--userspec=65532:65532")
        .arg(&root)
        .args([
            "/usr/local/bin/trainlet",
            "gpus",
            "--nvml-lib",
            "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
        ])
        .env("FAKE_NVML_COUNT", "2")
        .output()
        .unwrap();
    assert_eq!(stdout_json(&gpus), two_fake_gpus());
}
