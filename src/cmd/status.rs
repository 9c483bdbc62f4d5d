//! `trainlet status` (and `kubectl trainlet status`): lists the job's pods and the
//! namespace's Events once, prints the table or JSON and the verdict. Reads only.

use crate::cli::args::StatusArgs;
use crate::cli::values::StatusOutput;
use crate::cli::{explain, lower};
use crate::status::{self, fetch};
use crate::{Exit, Failure, kube};

pub fn run(args: StatusArgs) -> Result<Exit, Failure> {
    let target = lower::status_target(&args)?;
    let view = super::runtime()?.block_on(async {
        let (client, default_ns) = kube::client(args.kubeconfig.as_deref())
            .await
            .map_err(|e| explain::status(&e))?;
        let ns = args.namespace.clone().unwrap_or(default_ns);
        let candidates = target.candidates();
        let mut found = None;
        for (i, (what, selectors)) in candidates.iter().enumerate() {
            let pods = fetch::pods(&client, &ns, selectors)
                .await
                .map_err(|e| explain::status(&e))?;
            if !pods.is_empty() || i + 1 == candidates.len() {
                found = Some((what.clone(), pods));
                break;
            }
        }
        let (what, pods) = found.unwrap_or_default();
        let events = fetch::events(&client, &ns)
            .await
            .map_err(|e| explain::status(&e))?;
        Ok::<_, Failure>(status::view(&what, &pods, &events))
    })?;
    match args.output {
        StatusOutput::Table => print!("{}", status::table(&view)),
        StatusOutput::Json => println!("{}", serde_json::to_string(&view).expect("plain data")),
    }
    Ok(Exit::OK)
}
