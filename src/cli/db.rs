//! `runwarden db migrate|status`: the schema of the shared state.

use std::path::Path;
use std::sync::Arc;

use super::{DbCommand, Exit, Failed};
use crate::store::Postgres;

pub(super) async fn db(command: DbCommand) -> Exit {
    match command {
        DbCommand::Migrate { config } => {
            let store = open(&config)?;
            let applied = store.migrate().await.map_err(|e| {
                Failed::code(
                    1,
                    format!("{e}; nothing past the last applied migration changed"),
                )
            })?;
            match applied.as_slice() {
                [] => println!("the schema is current; nothing to do"),
                versions => println!("applied migration(s) {versions:?}; the schema is current"),
            }
            Ok(0)
        }
        DbCommand::Status { config } => {
            let store = open(&config)?;
            match store.check_schema().await {
                Ok(()) => {
                    println!(
                        "reachable; the schema is this runwarden's (replica {})",
                        store.replica
                    );
                    Ok(0)
                }
                Err(e) => Err(Failed::code(1, e)),
            }
        }
    }
}

/// The store runwarden.yaml names, or a usage error saying how to name one.
pub(super) fn open(dir: &Path) -> Result<Arc<Postgres>, Failed> {
    shared(dir)?.ok_or_else(|| {
        Failed::usage(format!(
            "{} sets no `state: postgres:`; each daemon keeps its own state, and there is no database to migrate",
            dir.join("runwarden.yaml").display()
        ))
    })
}

/// The store runwarden.yaml names, if it names one.
pub(super) fn shared(dir: &Path) -> Result<Option<Arc<Postgres>>, Failed> {
    let settings = crate::config::Settings::load(dir).map_err(Failed::usage)?;
    match &settings.postgres {
        None => Ok(None),
        Some(shared) => Postgres::open(shared, &settings.replica)
            .map(|s| Some(Arc::new(s)))
            .map_err(Failed::usage),
    }
}
