//! `trainlet gpus`: the GPUs visible through NVML, as JSON, like TensorFlow's
//! `num_accelerators()` but with the devices and the reason when NVML is unavailable.
//! It exits 0 even without NVML: "no GPUs, and why" is an answer.

use crate::cli::args::GpusArgs;
use crate::report::probe::gpu::GpuProbe;
use crate::{Exit, Failure};

pub fn run(args: GpusArgs) -> Result<Exit, Failure> {
    let info = GpuProbe::new(args.nvml_lib).probe();
    println!("{}", info.to_json());
    Ok(Exit::OK)
}
