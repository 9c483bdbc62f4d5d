//! `trainlet gpus`: the GPUs visible through NVML, as JSON.

use std::path::PathBuf;

use clap::Args;

use crate::{Code, Failure};

#[derive(Debug, Clone, Args)]
pub struct GpusArgs {
    /// Path of the NVML library to load instead of the system's libnvidia-ml.so.1.
    #[arg(long, env = "TRAINLET_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
}

pub fn run(_args: GpusArgs) -> Result<Code, Failure> {
    Err(Failure::not_implemented("trainlet gpus"))
}
