//! `make release` (docker/release.sh), used as a cluster admin would use it: the
//! checksums hold, the OCI archive is one index of linux/amd64 and linux/arm64 that
//! `skopeo copy --all` carries whole, each platform's image runs its own binary on its
//! own glibc (under QEMU's user-mode emulation, rooted in the image), `install.yaml`
//! pins that index's digest and, applied to the control plane, injects a labelled pod in
//! a Pod Security `restricted` namespace without a warning; and a second release of the
//! same binaries is byte for byte the first.
//!
//! `make test` runs `make release` first; without its artifacts these tests fail, or
//! are skipped where `TRAINLET_TEST_SKIP` names `portable`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::admission::{container, init_images, labelled};
use crate::glibc::{portable, portable_arm64};
use crate::support::*;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const REPOSITORY: &str = "ghcr.io/trainlet/trainlet";

/// target/release-artifacts, if `make release` has written it.
pub(crate) fn artifacts() -> Result<PathBuf, Missing> {
    let dir = repo().join("target/release-artifacts");
    if dir.join("SHA256SUMS").is_file() {
        Ok(dir)
    } else {
        Err(Missing::new(
            Group::Portable,
            format!(
                "no release in {} (run `make release`; `make test` does)",
                dir.display()
            ),
        ))
    }
}

fn json_file(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A blob of an OCI layout, by digest.
fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

/// The digest of the image index that the layout's one tag names, after checking that
/// the blob has that digest.
fn index_digest(layout: &Path) -> String {
    let top = json_file(&layout.join("index.json"));
    let entry = &top["manifests"][0];
    assert_eq!(top["manifests"].as_array().unwrap().len(), 1, "{top}");
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        VERSION
    );
    let digest = entry["digest"].as_str().unwrap().to_string();
    let sum = stdout_of(Command::new("sha256sum").arg(blob(layout, &digest)));
    assert_eq!(format!("sha256:{}", &sum[..64]), digest);
    digest
}

fn unpack(archive: &Path, into: &Path) {
    std::fs::create_dir_all(into).unwrap();
    stdout_of(
        Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(into),
    );
}

/// QEMU's user-mode emulator for an OCI architecture.
fn qemu(arch: &str) -> &'static str {
    match arch {
        "amd64" => "qemu-x86_64",
        "arm64" => "qemu-aarch64",
        other => panic!("no platform {other} in a release"),
    }
}

#[test]
fn the_release_is_one_checksummed_index_of_two_platforms_pinned_by_install_yaml() {
    let dir = require!(artifacts());
    for tool in ["skopeo", "qemu-x86_64", "qemu-aarch64"] {
        require!(on_path(
            Group::Deps,
            tool,
            "Debian packages skopeo, qemu-user"
        ));
    }
    let v = VERSION;
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    let names: Vec<&str> = sums.lines().map(|l| &l[66..]).collect();
    assert_eq!(
        names,
        [
            format!("trainlet-{v}-linux-amd64.tar.gz"),
            format!("trainlet-{v}-linux-arm64.tar.gz"),
            format!("trainlet-{v}-linux-amd64.docker.tar"),
            format!("trainlet-{v}-linux-arm64.docker.tar"),
            format!("trainlet-{v}.oci.tar"),
            "install.yaml".to_string(),
            format!("trainlet-{v}-linux-amd64.cdx.json"),
            format!("trainlet-{v}-linux-arm64.cdx.json"),
        ]
    );
    stdout_of(
        Command::new("sha256sum")
            .args(["--check", "--strict", "SHA256SUMS"])
            .current_dir(&dir),
    );

    // The OCI archive: one index, two platforms; `skopeo copy --all` (what a user runs
    // to publish it to a registry) carries the index whole.
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("oci");
    unpack(&dir.join(format!("trainlet-{v}.oci.tar")), &layout);
    let digest = index_digest(&layout);
    let index = json_file(&blob(&layout, &digest));
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let platforms: Vec<(String, String)> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let p = &m["platform"];
            (p["os"].to_string(), p["architecture"].to_string())
        })
        .collect();
    assert_eq!(
        platforms,
        [
            ("\"linux\"".into(), "\"amd64\"".into()),
            ("\"linux\"".into(), "\"arm64\"".into())
        ]
    );
    let copy = work.path().join("copy");
    stdout_of(
        Command::new("skopeo")
            .args(["copy", "--quiet", "--all"])
            .arg(format!(
                "oci-archive:{}:{v}",
                dir.join(format!("trainlet-{v}.oci.tar")).display()
            ))
            .arg(format!("oci:{}:{v}", copy.display())),
    );
    assert_eq!(index_digest(&copy), digest);

    // Each platform's image runs its own binary, the one in that platform's tarball, on
    // the glibc in the image (QEMU's -L roots the loader and its libraries there).
    for manifest in index["manifests"].as_array().unwrap() {
        let arch = manifest["platform"]["architecture"].as_str().unwrap();
        let image = json_file(&blob(&layout, manifest["digest"].as_str().unwrap()));
        let config = json_file(&blob(&layout, image["config"]["digest"].as_str().unwrap()));
        assert_eq!(config["architecture"], arch);
        assert_eq!(config["config"]["User"], "65532:65532");
        let rootfs = work.path().join(format!("rootfs-{arch}"));
        let [layer] = image["layers"].as_array().unwrap().as_slice() else {
            panic!("one layer: {image}")
        };
        unpack(&blob(&layout, layer["digest"].as_str().unwrap()), &rootfs);
        let bin = rootfs.join("usr/local/bin/trainlet");
        let version = stdout_of(
            Command::new(qemu(arch))
                .arg("-L")
                .arg(&rootfs)
                .arg(&bin)
                .arg("--version"),
        );
        assert_eq!(version, format!("trainlet {v}\n"), "{arch}");
        let tarball = work.path().join(format!("tar-{arch}"));
        unpack(
            &dir.join(format!("trainlet-{v}-linux-{arch}.tar.gz")),
            &tarball,
        );
        assert!(
            std::fs::read(tarball.join("trainlet")).unwrap() == std::fs::read(&bin).unwrap(),
            "{arch}: the image's binary is the tarball's"
        );
        for doc in ["README.md", "LICENSE"] {
            assert!(tarball.join(doc).is_file(), "{arch}: {doc} in the tarball");
        }
        // The platform's docker-archive: the same image, under the name the manifests run.
        let archive = dir.join(format!("trainlet-{v}-linux-{arch}.docker.tar"));
        let inspected: Value = serde_json::from_str(&stdout_of(
            Command::new("skopeo")
                .arg("inspect")
                .arg(format!("docker-archive:{}", archive.display())),
        ))
        .unwrap();
        assert_eq!(inspected["Architecture"], arch);
        assert_eq!(inspected["Layers"][0], config["rootfs"]["diff_ids"][0]);
    }

    // install.yaml: the parameter object names the index by digest, nothing names a tag.
    let install = std::fs::read_to_string(dir.join("install.yaml")).unwrap();
    assert!(!install.contains(&format!("{REPOSITORY}:")), "{install}");
    let pinned = format!("{REPOSITORY}@{digest}");
    let docs = yaml_rust2::YamlLoader::load_from_str(&install).unwrap();
    let objects: Vec<(String, String, String)> = docs
        .iter()
        .map(|d| {
            let meta = &d["metadata"];
            let field = |y: &yaml_rust2::Yaml| y.as_str().unwrap_or_default().to_string();
            (
                field(&d["kind"]),
                field(&meta["namespace"]),
                field(&meta["name"]),
            )
        })
        .collect();
    let object = |kind: &str, ns: &str, name: &str| (kind.into(), ns.into(), name.into());
    for rbac in ["ServiceAccount", "Role", "RoleBinding"] {
        assert!(
            objects.contains(&object(rbac, "default", "trainlet")),
            "{rbac} in default: {objects:?}"
        );
    }
    let params = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("ConfigMap"))
        .expect("the parameter object");
    assert_eq!(params["metadata"]["name"].as_str(), Some("trainlet-inject"));
    assert_eq!(params["data"]["image"].as_str(), Some(pinned.as_str()));

    // Each platform's SBOM: CycloneDX, naming trainlet and the crates of the design card.
    for arch in ["amd64", "arm64"] {
        let sbom = json_file(&dir.join(format!("trainlet-{v}-linux-{arch}.cdx.json")));
        assert_eq!(sbom["bomFormat"], "CycloneDX", "{arch}");
        assert_eq!(sbom["metadata"]["component"]["name"], "trainlet", "{arch}");
        let crates: Vec<&str> = sbom["components"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        for name in [
            "tokio",
            "kube",
            "k8s-openapi",
            "nvml-wrapper",
            "hyper",
            "serde_json",
        ] {
            assert!(
                crates.contains(&name),
                "{name} in the {arch} SBOM: {crates:?}"
            );
        }
    }
}

/// Two runs of `make release` write the same bytes, so the same digests (the binaries
/// are built once: the second run finds them up to date).
#[test]
fn two_releases_of_the_same_binaries_are_the_same_bytes() {
    require!(portable());
    require!(portable_arm64());
    let dir = tempfile::tempdir().unwrap();
    let release = |name: &str| {
        let out = dir.path().join(name);
        let mut make = Command::new("make");
        // Without the variables cargo sets for a test: a build script that reads one
        // (ring's reads CARGO_MANIFEST_DIR) would run again and rebuild the binaries.
        const SET_BY_CARGO: [&str; 7] = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_TARGET_TMPDIR",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_RUSTC_CURRENT_DIR",
        ];
        for (k, _) in std::env::vars() {
            if k == "CARGO" || SET_BY_CARGO.iter().any(|p| k.starts_with(p)) {
                make.env_remove(k);
            }
        }
        stdout_of(
            make.args(["--no-print-directory", "release"])
                .current_dir(repo())
                .env("TRAINLET_RELEASE_DIR", &out),
        );
        std::fs::read_to_string(out.join("SHA256SUMS")).unwrap()
    };
    let first = release("first");
    assert_eq!(first.lines().count(), 8, "{first}");
    assert_eq!(release("second"), first);
}

/// `kubectl apply --server-side -f install.yaml`, as the README says, on a new control
/// plane of its own (install.yaml holds the guard, which would deny the other tests'
/// unbound tokens): no warning, trainlet's RBAC is in `default`; with the RBAC applied to
/// a namespace that enforces and warns at Pod Security `restricted`, a labelled pod there
/// comes out injected with the pinned image, with no warning.
#[tokio::test]
async fn install_yaml_applies_and_injects_the_pinned_image_in_a_restricted_namespace() {
    let dir = require!(artifacts());
    let cp = PrivateControlPlane::start("install");
    let kc = cp.kubeconfig.as_path();
    let client = client_from(kc).await;
    let ns = namespace_with_labels(
        &client,
        "install",
        &[
            ("pod-security.kubernetes.io/enforce", "restricted"),
            ("pod-security.kubernetes.io/enforce-version", "latest"),
            ("pod-security.kubernetes.io/warn", "restricted"),
            ("pod-security.kubernetes.io/warn-version", "latest"),
        ],
    )
    .await;
    let install = dir.join("install.yaml");
    kubectl_on(
        kc,
        &[
            "--warnings-as-errors",
            "apply",
            "--server-side",
            "-f",
            install.to_str().unwrap(),
        ],
    );
    for object in ["serviceaccount", "role", "rolebinding"] {
        kubectl_on(kc, &["get", "-n", "default", object, "trainlet"]);
    }
    // The jobs' own namespace gets the RBAC as install.yaml's header says.
    let manifests = repo().join("manifests");
    kubectl_on(
        kc,
        &[
            "--warnings-as-errors",
            "apply",
            "-n",
            &ns,
            "-k",
            manifests.to_str().unwrap(),
        ],
    );
    let params = kubectl_on(
        kc,
        &[
            "get",
            "-n",
            "trainlet-system",
            "configmap",
            "trainlet-inject",
            "-o",
            "jsonpath={.data.image}",
        ],
    );
    assert!(
        params.starts_with(&format!("{REPOSITORY}@sha256:")),
        "{params}"
    );
    let pod = labelled(
        "installed",
        json!({"trainlet.io/job": "worker=app=trainer"}),
        json!([container("main", json!(["python", "train.py"]))]),
    );
    let injected = |image: String| {
        let (pod, ns) = (&pod, &ns);
        async move {
            let what = format!("the image {image}");
            eventually(&what, Duration::from_secs(60), || async {
                let (images, warnings) = init_images(kc, ns, pod).ok()?;
                (images == [image.as_str(), image.as_str()]).then(|| assert_eq!(warnings, ""))
            })
            .await
        }
    };
    injected(params).await;
    // The image of the user's registry: one field, as the README's install says.
    let mine = "registry.example.test/trainlet:0.1.0";
    kubectl_on(
        kc,
        &[
            "--warnings-as-errors",
            "patch",
            "configmap",
            "trainlet-inject",
            "-n",
            "trainlet-system",
            "--type",
            "merge",
            "-p",
            &json!({"data": {"image": mine}}).to_string(),
        ],
    );
    injected(mine.to_string()).await;
}
