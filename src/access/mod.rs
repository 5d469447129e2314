//! Who may do what: principals, their tokens, the
//! scopes each holds, and [`authorize`], the one check every entry point
//! makes (the HTTP API, the Alertmanager webhook, `/mcp`, and the CLI
//! through a daemon, which speaks the API).
//!
//! Deny by default: a caller holds nothing but the grants its principal
//! lists, each one scope limited to runbook names or globs (`approve` also
//! to tiers). A token is known only by its sha256, compared in constant
//! time, and has an id, which is what the audit log and the daemon's log
//! name; it may expire. The approver of a decision is always the
//! authenticated caller, never a name a request carries.
//!
//! The file is `principals_file` (read by [`file`]); the older approvers
//! file of `NAME TOKEN` lines is still read, each line a principal that may
//! approve anything and nothing else. Two callers are built in, for the
//! tokens that predate principals: the webhook token (and, without one, a
//! request to loopback), and the `/mcp` token. They keep what they could do
//! before, and no more: neither may approve nor touch the kill switch.

pub(crate) mod file;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

pub(crate) use file::FileError;

/// What a principal may be granted. The names are the file's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Scope {
    /// Start runs (the runs API, the webhook, an MCP session).
    RunTrigger,
    /// Read runs, rollouts and the kill switch's state.
    RunRead,
    /// Approve or deny an L2 call.
    Approve,
    /// Engage the kill switch.
    KillEngage,
    /// Release the kill switch.
    KillRelease,
    /// Resume or abort a rollout.
    RolloutControl,
    /// Read the audit log through the API.
    AuditRead,
}

impl Scope {
    /// Every scope, in the order the docs list them.
    pub(crate) const ALL: [Scope; 7] = [
        Scope::RunTrigger,
        Scope::RunRead,
        Scope::Approve,
        Scope::KillEngage,
        Scope::KillRelease,
        Scope::RolloutControl,
        Scope::AuditRead,
    ];

    /// Its name in the principals file and the audit log.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scope::RunTrigger => "run:trigger",
            Scope::RunRead => "run:read",
            Scope::Approve => "approve",
            Scope::KillEngage => "kill:engage",
            Scope::KillRelease => "kill:release",
            Scope::RolloutControl => "rollout:control",
            Scope::AuditRead => "audit:read",
        }
    }

    /// The scope a file names.
    pub(crate) fn parse(name: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether every decision on it, allowed or denied, is audited: what
    /// changes who may act (a decision, a stop, a rollout's course).
    pub(crate) fn audited(self) -> bool {
        matches!(
            self,
            Scope::Approve | Scope::KillEngage | Scope::KillRelease | Scope::RolloutControl
        )
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One scope, for the runbooks its globs match (`*`: any run of
/// characters, `?`: one), and for `approve` the tiers it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) scope: Scope,
    pub(crate) runbooks: Vec<String>,
    pub(crate) tiers: Vec<u8>,
}

impl Grant {
    /// `scope` for every runbook (and, for `approve`, tier 2).
    pub(crate) fn everywhere(scope: Scope) -> Grant {
        Grant {
            scope,
            runbooks: vec!["*".into()],
            tiers: vec![2],
        }
    }

    /// Whether it covers `runbook` (`None`: every runbook at once, as a
    /// global kill switch does: only a glob that matches anything does).
    fn covers(&self, runbook: Option<&str>) -> bool {
        match runbook {
            Some(rb) => self.runbooks.iter().any(|g| glob(g, rb)),
            None => self.runbooks.iter().any(|g| g.chars().all(|c| c == '*')),
        }
    }
}

/// Whether `name` matches `pattern` (`*` any run of characters, `?` one).
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match, backtracking to the last `*` only.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            (i, j) = (i + 1, j + 1);
        } else if i < p.len() && p[i] == '*' {
            (star, mark, i) = (Some(i), j, i + 1);
        } else if let Some(s) = star {
            (i, mark) = (s + 1, mark + 1);
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// One token of a principal: its id, its sha256, until when it is good.
#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) id: String,
    pub(crate) sha256: [u8; 32],
    pub(crate) expires: Option<jiff::Timestamp>,
}

/// A person or a program, with its tokens and grants.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    pub(crate) name: String,
    pub(crate) tokens: Vec<Token>,
    /// Who it is in chat (`slack:TEAM/USER`): a click of that user acts
    /// as this principal, within its grants.
    pub(crate) chat: Vec<String>,
    pub(crate) grants: Vec<Grant>,
}

impl Principal {
    fn holds(&self, scope: Scope) -> bool {
        self.grants.iter().any(|g| g.scope == scope)
    }
}

/// Who is asking, as authenticated: the principal and the token's id
/// (never the token), with what the principal holds.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    principal: Arc<Principal>,
    /// The token's id, or how the caller was known (`loopback`).
    pub(crate) token_id: String,
    /// One of the callers that predate principals (no principal's token).
    builtin: bool,
}

impl Caller {
    /// The principal's name: who a decision is stamped with.
    pub(crate) fn name(&self) -> &str {
        &self.principal.name
    }

    /// The caller of the API's webhook token (`webhook_token_file`), or of
    /// a request to loopback when none is set: what that token could do
    /// before principals, and no more.
    pub(crate) fn webhook(token_id: &str) -> Caller {
        builtin(
            "webhook",
            token_id,
            &[
                Scope::RunTrigger,
                Scope::RunRead,
                Scope::RolloutControl,
                Scope::AuditRead,
            ],
        )
    }

    /// The caller of `/mcp`'s own token (`mcp_token_file`): it may start a
    /// session's run of any runbook, and nothing else.
    pub(crate) fn mcp_token() -> Caller {
        builtin("mcp", "mcp_token_file", &[Scope::RunTrigger])
    }

    /// Whether it is a caller that predates principals (the webhook or
    /// `/mcp` token, loopback): it was never asked who it is.
    pub(crate) fn builtin(&self) -> bool {
        self.builtin
    }

    /// Whether it holds `scope` for any runbook at all.
    pub(crate) fn holds(&self, scope: Scope) -> bool {
        self.principal.holds(scope)
    }

    /// Whether it holds `scope` for `runbook` (a list's filter).
    pub(crate) fn may(&self, scope: Scope, runbook: &str) -> bool {
        authorize(self, scope, Some(runbook), None).is_ok()
    }
}

fn builtin(name: &str, token_id: &str, scopes: &[Scope]) -> Caller {
    Caller {
        principal: Arc::new(Principal {
            name: name.into(),
            tokens: Vec::new(),
            chat: Vec::new(),
            grants: scopes.iter().map(|s| Grant::everywhere(*s)).collect(),
        }),
        token_id: token_id.into(),
        builtin: true,
    }
}

/// Why a caller may not: said to the caller (403) and audited.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{principal} (token {token_id}) {why}")]
pub(crate) struct Refused {
    pub(crate) principal: String,
    pub(crate) token_id: String,
    pub(crate) why: String,
}

/// The one decision: may `caller` use `scope` on `runbook` (`None`: on
/// every runbook at once), at `tier` when it approves a call.
pub(crate) fn authorize(
    caller: &Caller,
    scope: Scope,
    runbook: Option<&str>,
    tier: Option<u8>,
) -> Result<(), Refused> {
    let p = &caller.principal;
    let grants: Vec<&Grant> = p.grants.iter().filter(|g| g.scope == scope).collect();
    let refuse = |why: String| Refused {
        principal: p.name.clone(),
        token_id: caller.token_id.clone(),
        why,
    };
    if grants.is_empty() {
        return Err(refuse(format!("holds no {scope}")));
    }
    let covering: Vec<&&Grant> = grants.iter().filter(|g| g.covers(runbook)).collect();
    if covering.is_empty() {
        let globs: Vec<&str> = grants
            .iter()
            .flat_map(|g| g.runbooks.iter().map(String::as_str))
            .collect();
        let what = match runbook {
            Some(rb) => format!("runbook {rb:?}"),
            None => "every runbook at once (it needs runbooks: [\"*\"])".into(),
        };
        return Err(refuse(format!(
            "holds {scope} only for runbooks {}, not for {what}",
            globs.join(", ")
        )));
    }
    if let Some(tier) = tier
        && !covering.iter().any(|g| g.tiers.contains(&tier))
    {
        return Err(refuse(format!(
            "holds {scope} for this runbook, but not at tier {tier}"
        )));
    }
    Ok(())
}

/// Why a token is not taken (401).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Unknown {
    /// No principal has it.
    #[error("unknown token")]
    Token,
    /// Its time is over.
    #[error("token {id} of {principal} expired at {at}: ask for a new one")]
    Expired {
        principal: String,
        id: String,
        at: jiff::Timestamp,
    },
}

/// Every principal of the file in force.
#[derive(Debug, Default)]
pub(crate) struct Principals {
    list: Vec<Arc<Principal>>,
}

impl Principals {
    pub(crate) fn new(list: Vec<Principal>) -> Principals {
        Principals {
            list: list.into_iter().map(Arc::new).collect(),
        }
    }

    /// How many principals it names.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// The caller `token` authenticates at `now`. Every stored hash is
    /// compared, in constant time, whichever matches.
    pub(crate) fn authenticate(
        &self,
        token: &[u8],
        now: jiff::Timestamp,
    ) -> Result<Caller, Unknown> {
        let given: [u8; 32] = Sha256::digest(token).into();
        let mut found = None;
        for p in &self.list {
            for t in &p.tokens {
                if crate::same_secret(&t.sha256, &given) {
                    found = Some((p, t));
                }
            }
        }
        let (p, t) = found.ok_or(Unknown::Token)?;
        if let Some(at) = t.expires
            && at <= now
        {
            return Err(Unknown::Expired {
                principal: p.name.clone(),
                id: t.id.clone(),
                at,
            });
        }
        Ok(Caller {
            principal: p.clone(),
            token_id: t.id.clone(),
            builtin: false,
        })
    }
}

impl Caller {
    /// A chat user no principal names: it may do nothing, and what it
    /// tried is audited under its identity (`slack:TEAM/USER`, which no
    /// principal's name can be: names hold no `:`).
    pub(crate) fn stranger(identity: &str) -> Caller {
        Caller {
            principal: Arc::new(Principal {
                name: identity.into(),
                tokens: Vec::new(),
                chat: Vec::new(),
                grants: Vec::new(),
            }),
            token_id: identity.into(),
            builtin: false,
        }
    }
}

impl Caller {
    /// Whether this is a chat user no principal names ([`Caller::stranger`]).
    pub(crate) fn stranger_in_chat(&self) -> bool {
        self.principal.name.contains(':')
    }

    /// Whether it is known by a chat identity rather than a token
    /// ([`Principals::chat`], [`Caller::stranger`]).
    pub(crate) fn in_chat(&self) -> bool {
        self.token_id.contains(':')
    }
}

impl Principals {
    /// The caller a chat identity (`slack:TEAM/USER`) is, if a principal
    /// names it; its "token id" is the identity.
    pub(crate) fn chat(&self, identity: &str) -> Option<Caller> {
        let p = self
            .list
            .iter()
            .find(|p| p.chat.iter().any(|c| c == identity))?;
        Some(Caller {
            principal: p.clone(),
            token_id: identity.to_string(),
            builtin: false,
        })
    }
}

/// The principals in force, re-read on SIGHUP.
pub(crate) struct Access {
    file: PathBuf,
    now: std::sync::RwLock<Arc<Principals>>,
    /// Whether the last reload refused the file: then nobody is known.
    refused: std::sync::atomic::AtomicBool,
}

impl Access {
    /// Read `file` (a principals file or the older approvers file).
    pub(crate) fn load(file: &Path) -> Result<Access, FileError> {
        let principals = file::read(file)?;
        Ok(Access {
            file: file.to_path_buf(),
            now: std::sync::RwLock::new(Arc::new(principals)),
            refused: Default::default(),
        })
    }

    /// Read the file again. One that cannot be accepted fails closed: the
    /// old principals go too (a revocation must never be undone by a
    /// mistake in the new file), and nobody is known until a reload
    /// accepts one. How many principals it names.
    pub(crate) fn reload(&self) -> Result<usize, FileError> {
        let read = file::read(&self.file);
        self.refused
            .store(read.is_err(), std::sync::atomic::Ordering::Relaxed);
        let mut now = self.now.write().unwrap_or_else(|p| p.into_inner());
        match read {
            Ok(p) => {
                let n = p.len();
                *now = Arc::new(p);
                Ok(n)
            }
            Err(e) => {
                *now = Arc::default();
                Err(e)
            }
        }
    }

    /// Whether the last reload refused the file (nobody is known).
    pub(crate) fn refused(&self) -> bool {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The principals in force.
    pub(crate) fn principals(&self) -> Arc<Principals> {
        self.now.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str, token: &str, grants: Vec<Grant>) -> Principal {
        Principal {
            name: name.into(),
            tokens: vec![Token {
                id: format!("{name}-1"),
                sha256: Sha256::digest(token.as_bytes()).into(),
                expires: None,
            }],
            chat: Vec::new(),
            grants,
        }
    }

    fn grant(scope: Scope, runbooks: &[&str]) -> Grant {
        Grant {
            scope,
            runbooks: runbooks.iter().map(|s| s.to_string()).collect(),
            tiers: vec![2],
        }
    }

    #[test]
    fn globs_match_as_a_shell_matches_names() {
        for (p, n, ok) in [
            ("*", "anything", true),
            ("*", "", true),
            ("staging-*", "staging-disk-full", true),
            ("staging-*", "prod-disk-full", false),
            ("*-full", "staging-disk-full", true),
            ("disk-?ull", "disk-full", true),
            ("disk-?ull", "disk-ffull", false),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("", "", true),
            ("", "x", false),
        ] {
            assert_eq!(glob(p, n), ok, "{p:?} vs {n:?}");
        }
    }

    /// The table every entry point's answers come from.
    #[test]
    fn a_caller_may_only_what_a_grant_covers() {
        let ps = Principals::new(vec![
            principal(
                "alice",
                "alice-token-0123456789",
                vec![
                    grant(Scope::Approve, &["staging-*"]),
                    grant(Scope::KillEngage, &["*"]),
                ],
            ),
            principal(
                "alertmanager",
                "am-token-0123456789ab",
                vec![grant(Scope::RunTrigger, &["disk-full", "worker-*"])],
            ),
        ]);
        let now = jiff::Timestamp::now();
        let alice = ps.authenticate(b"alice-token-0123456789", now).unwrap();
        let am = ps.authenticate(b"am-token-0123456789ab", now).unwrap();
        type Case<'a> = (&'a Caller, Scope, Option<&'a str>, Option<u8>, bool);
        let cases: [Case<'_>; 12] = [
            (&alice, Scope::Approve, Some("staging-disk"), Some(2), true),
            (&alice, Scope::Approve, Some("prod-disk"), Some(2), false),
            (&alice, Scope::Approve, Some("staging-disk"), Some(3), false),
            (&alice, Scope::KillEngage, None, None, true),
            (&alice, Scope::KillEngage, Some("prod-disk"), None, true),
            (&alice, Scope::KillRelease, None, None, false),
            (&alice, Scope::RunTrigger, Some("disk-full"), None, false),
            (&am, Scope::RunTrigger, Some("disk-full"), None, true),
            (&am, Scope::RunTrigger, Some("worker-pool"), None, true),
            (&am, Scope::RunTrigger, Some("cert-expiry"), None, false),
            (&am, Scope::Approve, Some("disk-full"), Some(2), false),
            (&am, Scope::KillEngage, None, None, false),
        ];
        for (caller, scope, rb, tier, ok) in cases {
            let got = authorize(caller, scope, rb, tier);
            assert_eq!(
                got.is_ok(),
                ok,
                "{} {scope} {rb:?} {tier:?}: {got:?}",
                caller.name()
            );
        }
        let refused = authorize(&am, Scope::RunTrigger, Some("cert-expiry"), None).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "alertmanager (token alertmanager-1) holds run:trigger only for runbooks disk-full, worker-*, not for runbook \"cert-expiry\""
        );
        // A global switch needs a grant for every runbook at once.
        let narrow = Principals::new(vec![principal(
            "bob",
            "bob-token-0123456789ab",
            vec![grant(Scope::KillEngage, &["staging-*"])],
        )]);
        let bob = narrow.authenticate(b"bob-token-0123456789ab", now).unwrap();
        assert!(authorize(&bob, Scope::KillEngage, None, None).is_err());
        assert!(authorize(&bob, Scope::KillEngage, Some("staging-x"), None).is_ok());
    }

    #[test]
    fn an_unknown_or_expired_token_authenticates_nobody() {
        let mut p = principal("alice", "alice-token-0123456789", Vec::new());
        let now = jiff::Timestamp::now();
        p.tokens[0].expires = Some(now - jiff::SignedDuration::from_secs(1));
        let ps = Principals::new(vec![p]);
        assert_eq!(
            ps.authenticate(b"wrong-token-0123456789", now).unwrap_err(),
            Unknown::Token
        );
        let expired = ps.authenticate(b"alice-token-0123456789", now).unwrap_err();
        assert!(
            matches!(expired, Unknown::Expired { ref id, .. } if id == "alice-1"),
            "{expired:?}"
        );
        assert!(expired.to_string().contains("expired at"), "{expired}");
    }

    #[test]
    fn the_built_in_callers_keep_what_they_had_and_no_more() {
        let webhook = Caller::webhook("webhook_token_file");
        assert!(webhook.may(Scope::RunTrigger, "any"));
        assert!(webhook.may(Scope::RolloutControl, "any"));
        for never in [Scope::Approve, Scope::KillEngage, Scope::KillRelease] {
            assert!(!webhook.holds(never), "{never}");
        }
        let mcp = Caller::mcp_token();
        assert!(mcp.may(Scope::RunTrigger, "any"));
        assert!(!mcp.holds(Scope::Approve));
        assert!(!mcp.holds(Scope::RunRead));
    }
}
