//! `trainlet status` (and `kubectl trainlet status`): reads the Job or JobSet, lists
//! its pods and their Events once, prints the table or JSON and the verdict. Reads only.

use crate::cli::args::StatusArgs;
use crate::cli::values::StatusOutput;
use crate::cli::{explain, lower};
use crate::status::{self, Lookup, Owner, fetch};
use crate::{Exit, Failure, kube};

pub fn run(args: StatusArgs) -> Result<Exit, Failure> {
    let target = lower::status_target(&args)?;
    let view = super::runtime()?.block_on(async {
        let (client, default_ns) = kube::client(args.kubeconfig.as_deref())
            .await
            .map_err(|e| explain::status(&e))?;
        let ns = args.namespace.clone().unwrap_or(default_ns);
        let (what, owner, selectors) = match target.lookup() {
            Lookup::Pods { what, selectors } => (what, None, selectors),
            Lookup::Named { name, kinds } => {
                let mut found = None;
                for &kind in &kinds {
                    if let Some(obj) = fetch::object(&client, &ns, kind, &name)
                        .await
                        .map_err(|e| explain::status(&e))?
                    {
                        found = Some((kind, obj));
                        break;
                    }
                }
                // A job that does not exist is a mistake in the name or the namespace,
                // not an empty job: one line, exit 2.
                let (kind, obj) =
                    found.ok_or_else(|| Failure::usage(status::not_found(&name, &kinds, &ns)))?;
                let owner = Owner::of(kind, &obj);
                (owner.what.clone(), Some(owner), vec![kind.selector(&name)])
            }
        };
        let pods = fetch::pods(&client, &ns, &selectors)
            .await
            .map_err(|e| explain::status(&e))?;
        let events = fetch::events(&client, &ns, &pods)
            .await
            .map_err(|e| explain::status(&e))?;
        let today = k8s_openapi::jiff::Timestamp::now().to_string();
        let today = today.get(..10).unwrap_or_default();
        Ok::<_, Failure>(status::view(&what, owner.as_ref(), &pods, &events, today))
    })?;
    match args.output {
        StatusOutput::Table => print!("{}", status::table(&view)),
        StatusOutput::Json => println!("{}", serde_json::to_string(&view).expect("plain data")),
    }
    Ok(Exit::OK)
}
