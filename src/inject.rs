//! `trainlet inject`: adds trainlet to the pod templates of existing manifests.

use std::path::PathBuf;

use clap::Args;

use crate::{Code, Failure};

#[derive(Debug, Clone, Args)]
pub struct InjectArgs {
    /// Kubernetes YAML to read; `-` or absent reads standard input.
    #[arg(
        short = 'f',
        long = "filename",
        env = "TRAINLET_FILENAME",
        value_name = "FILE"
    )]
    pub filename: Option<PathBuf>,
}

pub fn run(_args: InjectArgs) -> Result<Code, Failure> {
    Err(Failure::not_implemented("trainlet inject"))
}
