//! One thin file per subcommand, the edges: lower the flags into a config (`cli`),
//! start the runtime, run one workflow of the domain, print the result. The errors the
//! workflows return become the one-line failure `main` prints, through `cli::explain`.

pub mod exec;
pub mod gpus;
pub mod init;
pub mod inject;
pub mod master;
pub mod resolve;
pub mod sidecar;
pub mod stacks;
pub mod status;

use crate::cli::Command;
use crate::{Code, Exit, Failure};

/// Runs one subcommand to the way the process should end.
pub fn run(command: Command) -> Result<Exit, Failure> {
    match command {
        Command::Init(a) => init::run(a),
        Command::Resolve(a) => resolve::run(a),
        Command::Master(a) => master::run(a),
        Command::Exec(a) => exec::run(a),
        Command::Sidecar(a) => sidecar::run(a),
        Command::Gpus(a) => gpus::run(a),
        Command::Inject(a) => inject::run(a),
        Command::Status(a) => status::run(a),
        Command::Stacks(a) => stacks::run(a),
    }
}

/// A single-threaded runtime: trainlet waits on a socket or two, and one thread keeps
/// the init container's memory and start-up cost minimal.
fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            Failure::new(
                Code::Internal,
                format!("cannot start the async runtime: {e}"),
            )
        })
}
