//! `trainlet gpus`: the GPUs visible through NVML, as JSON, like TensorFlow's
//! `num_accelerators()` but with the devices and the reason when NVML is unavailable.
//! It exits 0 even without NVML: "no GPUs, and why" is an answer.

use std::path::PathBuf;

use clap::Args;

use crate::report::gpu::GpuProbe;
use crate::{Code, Failure};

#[derive(Debug, Clone, Args)]
pub struct GpusArgs {
    /// Path of the NVML library to load instead of the system's libnvidia-ml.so.1.
    #[arg(long, env = "TRAINLET_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
}

pub fn run(args: GpusArgs) -> Result<Code, Failure> {
    let info = GpuProbe::new(args.nvml_lib).probe();
    println!("{}", info.to_json());
    Ok(Code::Ok)
}
