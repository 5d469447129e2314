// Audit lines come from the audit module's typed constructors only: a line
// cannot be built with made-up fields.
use runwarden::audit::Entry;

fn forge() -> Entry {
    Entry {
        outcome: Some("ok".into()),
        prev: String::new(),
        ..Default::default()
    }
}

fn main() {}
