// Nor can a line read back (or made up) be appended raw: only the typed
// constructors write, and they chain what they write.
use runwarden::audit::{AuditLog, Entry};

fn replay(log: &AuditLog, line: &str) {
    let entry: Entry = serde_json::from_str(line).unwrap();
    log.append(entry, true).unwrap();
}

fn main() {}
