//! A panic in a run is the run's end, never the daemon's, and never a run
//! left `running`.
//!
//! A bug anywhere in a run's stages (its planner, a tool's result, a
//! verification, the report, the audit log) used to unwind through the
//! run's task: the daemon's thread died with it, the run never wrote its
//! verdict, and its (runbook, host) stayed taken until a restart. So the
//! runner catches it twice: around the run loop, which then writes the
//! run's verdict line (`failed`, `reason: internal_error`, the panic's
//! message and place), and around the whole run, so whatever it held (its
//! run lock, its lease in the shared state, the daemon's permit and slot)
//! is given back as for any run that ended.

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::sync::Once;

use futures_util::FutureExt;

/// What a run's panic said, and where.
#[derive(Debug, Clone)]
pub(crate) struct Panicked {
    /// The panic's message.
    pub(crate) message: String,
    /// `file:line:column`, when the panic hook saw it.
    pub(crate) at: Option<String>,
}

impl std::fmt::Display for Panicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "internal error: {}", self.message)?;
        if let Some(at) = &self.at {
            write!(f, " at {at}")?;
        }
        write!(f, " (a bug in runwarden: please report it with this line)")
    }
}

thread_local! {
    /// Where the last panic on this thread happened, as the hook saw it.
    static PLACE: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Keep each panic's place for [`caught`] (the panic's own payload has
/// only its message), then let the hook before it print it as always.
fn remember_places() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = info
                .location()
                .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
            PLACE.with(|p| *p.borrow_mut() = at);
            before(info);
        }));
    });
}

/// Run `fut`; a panic while it is polled is `Err` with its message and
/// place instead of unwinding further.
pub(crate) async fn caught<F: Future>(fut: F) -> Result<F::Output, Panicked> {
    remember_places();
    AssertUnwindSafe(fut)
        .catch_unwind()
        .await
        .map_err(|payload| {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".into());
            Panicked {
                message: crate::text::one_line(&message),
                at: PLACE.with(|p| p.borrow_mut().take()),
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_is_its_message_and_place_never_an_unwind() {
        let ok = caught(async { 7 }).await.unwrap();
        assert_eq!(ok, 7);
        let e = caught(async {
            tokio::task::yield_now().await;
            let v: Vec<u8> = Vec::new();
            v[3]
        })
        .await
        .unwrap_err();
        assert!(e.message.contains("index out of bounds"), "{e:?}");
        let at = e.at.clone().unwrap();
        assert!(at.starts_with("src/run/internal.rs:"), "{at}");
        assert!(e.to_string().contains("internal error"), "{e}");
    }
}
