//! `trainlet sidecar`: the reporters in their own container.

use clap::Args;

use crate::cli::{KubeArgs, ReportArgs};
use crate::{Code, Failure};

#[derive(Debug, Clone, Args)]
pub struct SidecarArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub report: ReportArgs,
}

pub fn run(_args: SidecarArgs) -> Result<Code, Failure> {
    Err(Failure::not_implemented("trainlet sidecar"))
}
