//! Telling people: each approval request, when it opens and when it is
//! settled however it was (a decision through any door, expiry, the kill
//! switch, a resolved alert), to the approval webhook (signed, see
//! [`webhook`]) and to Slack (a message with buttons, rewritten when the
//! request is settled, see [`slack`]).
//!
//! Nothing here decides anything: a bridge or a chat that is down or slow
//! delays no run and approves or denies nothing; a decision comes back
//! only through the daemon's own doors, where [`crate::access`] says who
//! may make it. Sending happens in the background, and the messages of
//! one request leave in the order they were made (a bridge hears
//! `pending` before `approved`); other requests do not wait.

pub(crate) mod slack;
pub(crate) mod webhook;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::Settings;
use crate::gate::approvals::Request;

/// What is said of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// It waits for a person.
    Opened,
    /// It is decided, expired, withdrawn or cancelled.
    Settled,
}

impl Event {
    /// Its name in the webhook's payload.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Event::Opened => "opened",
            Event::Settled => "settled",
        }
    }
}

/// The messages on their way, and what Slack answered for each request
/// (the message to rewrite when it is settled).
#[derive(Default)]
pub(crate) struct Outbox {
    /// The last send of each request still under way: the next one of the
    /// same request waits for it.
    sending: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// Each open request's Slack message.
    slack: Arc<slack::Messages>,
}

impl Outbox {
    /// Tell whoever `settings` names of `request`, in the background.
    pub(crate) fn tell(&self, settings: &Settings, event: Event, request: Request) {
        let hook = settings
            .approval_webhook
            .clone()
            .map(|url| webhook::Hook::of(settings, url));
        let slack = settings.slack.clone();
        if hook.is_none() && slack.is_none() {
            return;
        }
        let messages = self.slack.clone();
        let mut sending = self.sending.lock().unwrap_or_else(|p| p.into_inner());
        sending.retain(|_, h| !h.is_finished());
        let before = sending.remove(&request.id);
        let id = request.id.clone();
        let send = tokio::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            if let Some(hook) = hook {
                hook.post(event, &request).await;
            }
            if let Some(slack) = slack {
                slack::tell(&slack, &messages, event, &request).await;
            }
        });
        sending.insert(id, send);
    }
}
