//! `cert_expiry` and `renew_certificate`: certificates parsed in Rust, renewed by the host's own command.

use std::path::Path;

use serde_json::{Value, json};

use super::PathMode;
use super::allowlists::*;
use super::args::*;
use super::registry::{Allowed, Change, Tier, Tool};
use super::{Ctx, Outcome, ToolResult, from_process, privileged};
use crate::host::Host;
use crate::process::Argv;

/// Certificate files larger than this are not read.
const MAX_CERT_BYTES: u64 = 1 << 20;

pub(crate) fn renew_argv(host: &Host, name: &str) -> Option<Argv> {
    let renew = host.certificates.get(name)?.renew.as_ref()?;
    let (program, args) = renew.split_first()?;
    Some(privileged(
        host,
        Argv::new(Path::new(program)).args(args.iter().cloned()),
    ))
}

/// What a certificate file says about itself.
#[derive(Debug, Clone)]
pub(crate) struct CertInfo {
    pub(crate) not_before: i64,
    pub(crate) not_after: i64,
    pub(crate) subject: String,
    pub(crate) issuer: String,
    pub(crate) serial: String,
}

/// Why a certificate file could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CertError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// Far larger than any certificate.
    #[error("{path} is {len} bytes; not a certificate")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size.
        len: u64,
    },
    /// Text that is not a PEM certificate, or bytes that are not X.509.
    #[error("{0}")]
    NotACertificate(String),
}

pub(crate) fn read_cert(path: &Path) -> Result<CertInfo, CertError> {
    let read = |source| CertError::Read {
        path: path.display().to_string(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    if meta.len() > MAX_CERT_BYTES {
        return Err(CertError::TooLarge {
            path: path.display().to_string(),
            len: meta.len(),
        });
    }
    let bytes = std::fs::read(path).map_err(read)?;
    parse_cert(&bytes).map_err(|e| CertError::NotACertificate(format!("{}: {e}", path.display())))
}

pub(crate) fn parse_cert(bytes: &[u8]) -> Result<CertInfo, CertError> {
    let der;
    let der_bytes: &[u8] =
        if bytes.starts_with(b"-----") || bytes.iter().take(64).all(|b| b.is_ascii()) {
            let (_, pem) = x509_parser::pem::parse_x509_pem(bytes)
                .map_err(|e| CertError::NotACertificate(format!("not a PEM certificate: {e}")))?;
            der = pem.contents;
            &der
        } else {
            bytes
        };
    let (_, cert) = x509_parser::parse_x509_certificate(der_bytes)
        .map_err(|e| CertError::NotACertificate(format!("not an X.509 certificate: {e}")))?;
    let validity = cert.validity();
    Ok(CertInfo {
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        serial: cert.raw_serial_as_string(),
    })
}

fn rfc3339(secs: i64) -> String {
    jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn info_json(name: &str, path: &Path, info: &CertInfo) -> Value {
    let now = jiff::Timestamp::now().as_second();
    let left = info.not_after - now;
    json!({
        "name": name,
        "path": path,
        "not_before": rfc3339(info.not_before),
        "not_after": rfc3339(info.not_after),
        "seconds_left": left,
        "days_left": left.div_euclid(86_400),
        "expired": left <= 0,
        "subject": info.subject,
        "issuer": info.issuer,
        "serial": info.serial,
    })
}

pub(crate) async fn expiry(ctx: &Ctx<'_>, name: &str) -> ToolResult {
    let path = &ctx.host.certificates[name].path;
    match read_cert(path) {
        Ok(info) => ToolResult::observed(info_json(name, path, &info)),
        Err(e) => ToolResult::failed(e),
    }
}

pub(crate) async fn renew(ctx: &Ctx<'_>, name: &str) -> ToolResult {
    let path = &ctx.host.certificates[name].path;
    let before = read_cert(path).ok();
    let Some(argv) = renew_argv(ctx.host, name) else {
        return ToolResult::failed(format!("certificate {name} has no renew command"));
    };
    let out = match ctx.run(&argv).await {
        Ok(o) => o,
        Err(e) => return ToolResult::failed(e),
    };
    let mut result = from_process(&out, json!({ "name": name }));
    result.data["before"] = before
        .as_ref()
        .map(|i| info_json(name, path, i))
        .unwrap_or(Value::Null);
    if result.outcome != Outcome::Ok {
        result.verified = Some(false);
        return result;
    }
    let after = read_cert(path);
    let verified = match (&before, &after) {
        (Some(b), Ok(a)) => a.not_after > b.not_after,
        (None, Ok(a)) => a.not_after > jiff::Timestamp::now().as_second(),
        (_, Err(_)) => false,
    };
    result.data["after"] = after
        .as_ref()
        .map(|i| info_json(name, path, i))
        .unwrap_or(Value::Null);
    result.data["evidence"] = json!(match (&before, &after) {
        (_, Err(e)) => format!("not verified: cannot read the certificate after renewal: {e}"),
        (Some(b), Ok(a)) if verified => format!(
            "not_after moved from {} to {}",
            rfc3339(b.not_after),
            rfc3339(a.not_after)
        ),
        (Some(b), Ok(_)) => format!("not verified: not_after is still {}", rfc3339(b.not_after)),
        (None, Ok(a)) => format!("new certificate valid until {}", rfc3339(a.not_after)),
    });
    result.verified = Some(verified);
    if !verified {
        result.outcome = Outcome::Error;
        result.error = Some(format!(
            "renewal of {name} ran but the certificate's not_after did not move later"
        ));
    }
    result
}

/// What a `cert_expiry` result said, in a person's words.
pub(super) fn said(data: &Value) -> String {
    let s = |k: &str| data[k].as_str().unwrap_or("?").to_string();
    format!(
        "{} expires {} ({} day(s) left), subject {}",
        s("name"),
        s("not_after"),
        data["days_left"],
        s("subject")
    )
}

/// `cert_expiry`: when an allowed certificate runs out.
pub(crate) struct CertExpiry;

impl Tool for CertExpiry {
    const NAME: &'static str = "cert_expiry";
    const TIER: Tier = Tier::Observe;
    const DESCRIPTION: &'static str =
        "Expiry of an allowed certificate file: not_after, days_left, subject, issuer.";
    type Args = NameArgs;
    type Resolved = String;

    fn allowed(host: &Host) -> Vec<(&'static str, Allowed)> {
        vec![(
            "name",
            Allowed::OneOf(host.certificates.keys().cloned().collect()),
        )]
    }

    fn resolve(a: NameArgs, host: &Host, _: PathMode) -> Result<String, ArgError> {
        allowed_key(&a.name, &host.certificates, "certificates")
    }

    fn args_json(name: &String) -> Value {
        json!({ "name": name })
    }

    fn argv(_: &String, _: &Host) -> Vec<Argv> {
        Vec::new()
    }

    async fn run(ctx: &Ctx<'_>, name: &String) -> ToolResult {
        expiry(ctx, name).await
    }

    fn said(data: &Value) -> Option<String> {
        Some(said(data))
    }
}

/// `renew_certificate`: the host's own renewal command, then a later `not_after`.
pub(crate) struct RenewCertificate;

impl Tool for RenewCertificate {
    const NAME: &'static str = "renew_certificate";
    const TIER: Tier = Tier::Change;
    const DESCRIPTION: &'static str = "Run the host's renewal command for an allowed certificate, then verify the new not_after is later than the old.";
    type Args = RenewArgs;
    type Resolved = Change<String>;

    fn resolve(a: RenewArgs, host: &Host, _: PathMode) -> Result<Change<String>, ArgError> {
        let name = allowed_key(&a.name, &host.certificates, "certificates")?;
        if host.certificates[&name].renew.is_none() {
            return Err(ArgError::NotAllowed(format!(
                "certificate \"{name}\" has no `renew` command in the host file"
            )));
        }
        Ok(Change::new(name, &a.reason))
    }

    fn args_json(c: &Change<String>) -> Value {
        json!({ "name": c.target })
    }

    fn reason(c: &Change<String>) -> Option<&str> {
        Some(&c.reason)
    }

    fn argv(c: &Change<String>, host: &Host) -> Vec<Argv> {
        renew_argv(host, &c.target).into_iter().collect()
    }

    async fn run(ctx: &Ctx<'_>, c: &Change<String>) -> ToolResult {
        renew(ctx, &c.target).await
    }

    fn targets(host: &Host) -> Option<(&'static str, Vec<String>)> {
        let renewable = host.certificates.iter().filter(|(_, c)| c.renew.is_some());
        Some(("name", renewable.map(|(n, _)| n.clone()).collect()))
    }
}
