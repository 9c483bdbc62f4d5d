//! The command line of one agent of the resolve scenario (resolve.rs): `trainlet init`,
//! the shell init container users write, or the floor, each under `/usr/bin/time`.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::resolve::Tool;

/// What every agent of one run shares.
pub struct Setup<'a> {
    pub tool: Tool,
    pub bin: &'a Path,
    pub kubeconfig: &'a Path,
    pub ns: &'a str,
    pub sel: &'a str,
    pub n: usize,
    pub port: u16,
    pub types: usize,
}

/// The agent for pod `pod_name` writing into `out`, under `/usr/bin/time`.
pub fn agent_command(s: &Setup, pod_name: &str, out: &Path) -> Command {
    let mut cmd = Command::new("/usr/bin/time");
    // Peak RSS in KiB, then user and system CPU seconds.
    cmd.arg("-f").arg("%M %U %S").arg("-o").arg(out.join("rss"));
    match s.tool {
        Tool::Trainlet | Tool::TrainletCoordinated => trainlet_args(&mut cmd, s, pod_name, out),
        Tool::KubectlWait | Tool::KubectlPoll => kubectl_args(&mut cmd, s, pod_name, out),
        Tool::Floor => {
            // The same kubeconfig, namespace and selector as trainlet's agents get.
            cmd.arg(s.bin)
                .arg("--kubeconfig")
                .arg(s.kubeconfig)
                .args(["--namespace", s.ns, "--selector", s.sel])
                .args(["--expect", &s.n.to_string()])
                .arg("--output-dir")
                .arg(out);
        }
    }
    // A file, not a pipe: a thousand agents would hold a thousand pipes open here.
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(out.join("stderr")).expect("stderr file"));
    cmd
}

/// `trainlet init` for pod `pod_name`, every peer watched or coordinated.
fn trainlet_args(cmd: &mut Command, s: &Setup, pod_name: &str, out: &Path) {
    let Setup {
        tool,
        bin,
        kubeconfig: kc,
        ns,
        sel,
        n,
        port,
        types,
    } = *s;
    let (jobs, expect) = if types == 2 {
        let ps = (n / 16).max(1);
        (
            vec![
                format!("ps={sel},role=ps"),
                format!("worker={sel},role=worker"),
            ],
            format!("ps={ps},worker={}", n - ps),
        )
    } else {
        (vec![format!("worker={sel}")], format!("worker={n}"))
    };
    cmd.arg(bin).arg("init").arg("--kubeconfig").arg(kc).args([
        "--pod-name",
        pod_name,
        "--pod-namespace",
        ns,
    ]);
    for j in &jobs {
        cmd.args(["--job", j]);
    }
    cmd.args([
        "--expect",
        &expect,
        "--port-name",
        "tf",
        "--port",
        &port.to_string(),
        "--timeout",
        "10m",
        "--log-level",
        "warn",
        "--coordinate",
        if tool == Tool::Trainlet {
            "never"
        } else {
            "always"
        },
    ])
    .arg("--output-dir")
    .arg(out);
}

/// The shell init container users write: wait, get the addresses, write TF_CONFIG.
fn kubectl_args(cmd: &mut Command, s: &Setup, pod_name: &str, out: &Path) {
    let Setup {
        tool,
        kubeconfig: kc,
        sel,
        n,
        port,
        ..
    } = *s;
    let wait = if tool == Tool::KubectlWait {
        "kubectl wait --for=jsonpath='{.status.phase}'=Running pod -l \"$SEL\" --timeout=600s >/dev/null".to_string()
    } else {
        format!(
            "until [ \"$(kubectl get pods -l \"$SEL\" -o jsonpath='{{range .items[*]}}{{.status.phase}}{{\"\\n\"}}{{end}}' | grep -c '^Running$')\" -eq {n} ]; do sleep 2; done"
        )
    };
    // What a user's shell init container does: wait, get the addresses, write
    // TF_CONFIG with the shell (natural order by name, own index by position).
    let script = format!(
        r#"set -eu
{wait}
list=$(kubectl get pods -l "$SEL" -o jsonpath='{{range .items[*]}}{{.metadata.name}}{{" "}}{{.status.podIP}}{{"\n"}}{{end}}' | sort -V)
hosts=$(printf '%s\n' "$list" | awk '{{printf "%s\"%s:{port}\"", (NR>1?",":""), $2}}')
idx=$(printf '%s\n' "$list" | awk -v me="$POD" '$1==me {{print NR-1}}')
printf '{{"cluster":{{"worker":[%s]}},"task":{{"type":"worker","index":%s}}}}\n' "$hosts" "$idx" >"$OUT/.tf_config.json.tmp"
mv "$OUT/.tf_config.json.tmp" "$OUT/tf_config.json"
"#
    );
    cmd.args(["sh", "-c", &script])
        .env("KUBECONFIG", kc)
        .env("SEL", sel)
        .env("POD", pod_name)
        .env("OUT", out)
        // A cold init container has no discovery cache.
        .env("KUBECACHEDIR", out.join("kube-cache"))
        .env("HOME", out);
}
