//! `trainlet stacks`: asks the `trainlet exec --report` of this pod for the Python
//! stacks of CMD's processes and prints them. Only exec, their ancestor, may read them
//! in a pod that runs with no capabilities; this process, started by `kubectl exec`,
//! is not their ancestor, so it asks exec through the pod's abstract socket.

use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::time::Duration;

use crate::cli::args::StacksArgs;
use crate::stacks;
use crate::{Code, Exit, Failure};

/// How long to wait for exec's answer: a capture takes at most 5 s.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read.
const MAX_ANSWER: u64 = 64 * 1024 * 1024;

pub fn run(args: StacksArgs) -> Result<Exit, Failure> {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let container = pick(stacks::listening(&table), args.container)?;
    let name = stacks::socket_name(&container);
    let failed = |e: std::io::Error| {
        Failure::new(
            Code::NotReady,
            format!("cannot ask trainlet exec beside {container} (@{name}): {e}"),
        )
    };
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).map_err(failed)?;
    let stream = std::os::unix::net::UnixStream::connect_addr(&addr).map_err(failed)?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(failed)?;
    let mut answer = String::new();
    stream
        .take(MAX_ANSWER)
        .read_to_string(&mut answer)
        .map_err(failed)?;
    print!("{answer}");
    Ok(Exit::OK)
}

/// The container to ask: the one named, else the only one listening.
fn pick(listening: Vec<String>, named: Option<String>) -> Result<String, Failure> {
    let not_ready = |m: String| Failure::new(Code::NotReady, m);
    match (named, listening.as_slice()) {
        (Some(c), l) if l.contains(&c) => Ok(c),
        (_, []) => Err(not_ready(
            "no trainlet exec --report listens in this pod: run trainlet stacks in a pod whose training container runs under trainlet exec --report".into(),
        )),
        (Some(c), l) => Err(not_ready(format!(
            "no trainlet exec --report beside container {c} listens in this pod; these do: {}",
            l.join(", ")
        ))),
        (None, [one]) => Ok(one.clone()),
        (None, l) => Err(Failure::new(
            Code::Usage,
            format!(
                "trainlet exec listens beside several containers ({}): name one with --container",
                l.join(", ")
            ),
        )),
    }
}
