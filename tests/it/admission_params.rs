//! The admission policy's parameter object (`trainlet-system/trainlet-inject`, a
//! ConfigMap that `trainlet inject --admission-policy` prints with the policy): the
//! image of trainlet's containers is one field of it, changed without generating the
//! policy again; missing or bad, the policy injects nothing, refuses nothing, and
//! warns whoever created the pod.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::admission::{PARAMS, container, init_images, install_unguarded, labelled};
use crate::support::*;

const OBJECT: [&str; 4] = ["-n", "trainlet-system", "configmap", "trainlet-inject"];

/// The shipped parameter object again, also when the test fails.
pub(crate) struct Shipped(pub(crate) &'static Path);

impl Drop for Shipped {
    fn drop(&mut self) {
        let dir = repo().join("manifests/admission");
        kubectl_on(self.0, &["apply", "-k", dir.to_str().unwrap()]);
    }
}

/// `kubectl create --dry-run=server` of `pod`: the images of its init containers (none
/// when it was not injected), and what kubectl printed on stderr (the API server's
/// warnings). A refusal fails the test.
fn admitted(kc: &Path, ns: &str, pod: &Value) -> (Vec<String>, String) {
    init_images(kc, ns, pod).unwrap_or_else(|stderr| panic!("refused:\n{stderr}"))
}

fn patch_data(kc: &Path, data: Value) {
    let patch = json!({"data": data}).to_string();
    let mut args = vec!["patch"];
    args.extend(&OBJECT[2..]);
    args.extend(&OBJECT[..2]);
    args.extend(["--type", "merge", "-p", &patch]);
    kubectl_on(kc, &args);
}

const WARNING: &str = "Warning: Validation failed for ValidatingAdmissionPolicy 'trainlet-inject-parameters' with binding 'trainlet-inject-parameters': trainlet.io/inject: this pod was not injected: the MutatingAdmissionPolicy trainlet-inject needs its parameter object, the ConfigMap trainlet-system/trainlet-inject, with a valid image, cpu and memory (kubectl get configmap -n trainlet-system trainlet-inject -o yaml)";

/// The image is one field; no object at all, then a bad quantity, inject nothing and
/// refuse nothing, with the warning; the shipped object injects again. Each step
/// starts from an outcome that the one before could not give, so that the policy's
/// cache of the object is known to have seen the change.
#[tokio::test]
async fn the_image_is_one_field_of_the_parameter_object_and_a_bad_one_injects_nothing() {
    let kc = kubeconfig();
    let client = admin().await;
    let ns = restricted_namespace(kc, &client, "admission-params").await;
    let _alone = PARAMS.write().await;
    install_unguarded(kc, &ns).await;
    let shipped_object = Shipped(kc);
    let pod = labelled(
        "params",
        json!({"trainlet.io/job": "worker=app=trainer"}),
        json!([container("main", json!(["python", "train.py"]))]),
    );
    let outcome = |want: (Vec<String>, String), what: &'static str| {
        let pod = &pod;
        let ns = &ns;
        async move {
            eventually(what, Duration::from_secs(30), || async {
                (admitted(kc, ns, pod) == want).then_some(())
            })
            .await
        }
    };
    let injected = |image: &str| (vec![image.to_string(), image.to_string()], String::new());
    let bare = (Vec::<String>::new(), WARNING.to_string());
    let shipped = "ghcr.io/trainlet/trainlet:0.1.0";
    outcome(injected(shipped), "the shipped image").await;

    let mirror = "registry.example.test/mirror/trainlet:0.1.0";
    patch_data(kc, json!({"image": mirror}));
    outcome(injected(mirror), "the new image").await;

    let mut delete = vec!["delete"];
    delete.extend(&OBJECT[2..]);
    delete.extend(&OBJECT[..2]);
    kubectl_on(kc, &delete);
    outcome(bare.clone(), "no parameter object").await;

    drop(shipped_object);
    let shipped_object = Shipped(kc);
    outcome(injected(shipped), "the shipped object again").await;
    // Memory in millibytes, as inject --resources refuses it.
    patch_data(kc, json!({"memory": "128m"}));
    outcome(bare, "a bad parameter object").await;

    drop(shipped_object);
    outcome(injected(shipped), "the shipped object at the end").await;
    delete_namespace(&client, &ns).await;
}
