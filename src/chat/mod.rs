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

use crate::config::{Settings, SlackSettings};
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
        self.send(hook, settings.slack.clone(), event, request);
    }

    /// Tell `hook` and `slack` of `request`, after what is still on its
    /// way of the same request.
    fn send(
        &self,
        hook: Option<webhook::Hook>,
        slack: Option<SlackSettings>,
        event: Event,
        request: Request,
    ) {
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::gate::approvals::State;
    use crate::gate::approvals::tests::request;

    /// A chat bridge that answers a `pending` message slowly still hears
    /// the same request's `withdrawn` after it, never before; another
    /// request's message does not wait for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_requests_messages_reach_the_webhook_in_the_order_sent() {
        use std::io::{BufRead, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/chat", listener.local_addr().unwrap());
        let heard: std::sync::Arc<Mutex<Vec<String>>> = Default::default();
        let log = heard.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(3) {
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut stream = stream.unwrap();
                    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                    let mut len = 0;
                    loop {
                        let mut line = String::new();
                        reader.read_line(&mut line).unwrap();
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; len];
                    reader.read_exact(&mut body).unwrap();
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    if v["state"] == "pending" && v["id"] == "slow" {
                        std::thread::sleep(Duration::from_millis(400));
                    }
                    log.lock().unwrap().push(format!(
                        "{} {}",
                        v["id"].as_str().unwrap(),
                        v["state"].as_str().unwrap()
                    ));
                    stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .unwrap();
                });
            }
        });
        let outbox = Outbox::default();
        let hook = || {
            Some(webhook::Hook::new(
                url.clone(),
                None,
                "http://runwarden".into(),
            ))
        };
        outbox.send(hook(), None, Event::Opened, request("slow"));
        let mut withdrawn = request("slow");
        withdrawn.state = State::Withdrawn {
            why: "resolved".into(),
        };
        outbox.send(hook(), None, Event::Settled, withdrawn);
        outbox.send(hook(), None, Event::Opened, request("other"));
        let started = std::time::Instant::now();
        while heard.lock().unwrap().len() < 3 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{:?}",
                heard.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let heard = heard.lock().unwrap().clone();
        assert_eq!(heard, ["other pending", "slow pending", "slow withdrawn"]);
    }
}
