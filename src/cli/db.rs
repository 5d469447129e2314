//! `runwarden db migrate|status`: the schema of the shared state.

use std::path::Path;
use std::sync::Arc;

use super::{DbCommand, Exit, Failed};
use crate::store::Postgres;

pub(super) async fn db(command: DbCommand) -> Exit {
    match command {
        DbCommand::Migrate { config, url_file } => {
            let store = open_as(&super::config_dir(config)?, url_file.as_deref())?;
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
            let store = open_as(&super::config_dir(config)?, None)?;
            match store.check_schema().await {
                Ok(crate::store::Schema::Current(v)) => {
                    println!(
                        "reachable; the schema is this runwarden's, version {v} (replica {})",
                        store.replica
                    );
                    Ok(0)
                }
                Ok(crate::store::Schema::OneAhead(v)) => {
                    println!(
                        "reachable; the schema is version {v}, one ahead of this runwarden's: it works on it during a rolling upgrade; upgrade this machine (replica {})",
                        store.replica
                    );
                    Ok(0)
                }
                Err(e) => Err(Failed::code(1, e)),
            }
        }
    }
}

/// The store runwarden.yaml names (through `url_file` instead, when
/// given), or a usage error saying how to name one.
fn open_as(dir: &Path, url_file: Option<&Path>) -> Result<Arc<Postgres>, Failed> {
    let settings = crate::config::Settings::load(dir).map_err(Failed::usage)?;
    let Some(mut shared) = settings.postgres.clone() else {
        return Err(Failed::usage(format!(
            "{} sets no `state: postgres:`; each daemon keeps its own state, and there is no database to migrate",
            dir.join("runwarden.yaml").display()
        )));
    };
    if let Some(file) = url_file {
        shared.url_file = file.to_path_buf();
    }
    Postgres::open(&shared, &settings.replica)
        .map(Arc::new)
        .map_err(Failed::usage)
}

/// The store runwarden.yaml names, if it names one.
pub(super) fn shared(dir: &Path) -> Result<Option<Arc<Postgres>>, Failed> {
    let settings = crate::config::Settings::load(dir).map_err(Failed::usage)?;
    Postgres::from_settings(&settings).map_err(Failed::usage)
}
