//! `trainlet init`: the init container. See `bootstrap` for the workflow.

use crate::cli::args::InitArgs;
use crate::cli::{explain, lower};
use crate::{Exit, Failure, bootstrap};

pub fn run(args: InitArgs) -> Result<Exit, Failure> {
    let cfg = lower::init_config(&args)?;
    super::runtime()?.block_on(bootstrap::run(&cfg, explain::init))?;
    Ok(Exit::OK)
}
