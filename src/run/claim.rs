//! A run's claim on its (runbook, host) in the shared state, as the run
//! loop sees it: proved before every call (the fence, which also counts a
//! tier-2 call against the fleet's budgets), and checked again without I/O
//! once the intent line is on disk. The store's lease is the one real
//! claim; the run loop's tests give it one that refuses on cue.

use std::future::Future;
use std::pin::Pin;

use crate::gate::DenyReason;
use crate::store::{Budgets, Lease};

/// Why a claim no longer allows a call: a denial's reason and detail.
pub(crate) type Lost = (DenyReason, String);

/// What the run loop asks of its claim.
pub(crate) trait Holding: Send + Sync {
    /// Prove the claim before a call (and, for a `mutating` one, count it
    /// against `budgets`): the lease is still this run's, the fleet's kill
    /// switch is off, the budget holds.
    fn fence<'a>(
        &'a self,
        mutating: bool,
        budgets: &'a Budgets,
    ) -> Pin<Box<dyn Future<Output = Result<(), Lost>> + Send + 'a>>;

    /// Whether the last fence or renewal still proves the claim now.
    fn still_proven(&self) -> Result<(), Lost>;

    /// The daemon is stopping and the run made no call: end it and queue
    /// its trigger (`request`, as the fleet's queue keeps it) as run
    /// `next`, for another replica. `Err`: why it stays with this run.
    fn hand_back<'a>(
        &'a self,
        next: &'a str,
        request: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<(), NotHanded>> + Send + 'a>>;
}

/// Why a stopping run's trigger stays with it rather than go to the
/// fleet's queue (it then ends `interrupted` here, as any run a stop ends).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotHanded {
    /// Another replica holds the lease now.
    #[error("its lease was no longer this run's")]
    LeaseGone,
    /// The shared state could not be written.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

impl Holding for Lease {
    fn fence<'a>(
        &'a self,
        mutating: bool,
        budgets: &'a Budgets,
    ) -> Pin<Box<dyn Future<Output = Result<(), Lost>> + Send + 'a>> {
        Box::pin(Lease::fence(self, mutating, budgets))
    }

    fn still_proven(&self) -> Result<(), Lost> {
        Lease::still_proven(self)
    }

    fn hand_back<'a>(
        &'a self,
        next: &'a str,
        request: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<(), NotHanded>> + Send + 'a>> {
        Box::pin(async move {
            match Lease::hand_back(self, next, request).await? {
                true => Ok(()),
                false => Err(NotHanded::LeaseGone),
            }
        })
    }
}
