// An intent line records only the crate's own permits: a type of the
// caller's that claims to be permitted does not compile.
use runwarden::audit::{AuditLog, Permitted, RunInfo};
use runwarden::gate::ApprovedBy;
use runwarden::tools::Action;

struct Mine(Action, ApprovedBy);

impl Permitted for Mine {
    fn step(&self) -> u32 {
        1
    }
    fn action(&self) -> &Action {
        &self.0
    }
    fn approved_by(&self) -> &ApprovedBy {
        &self.1
    }
}

fn forge(log: &AuditLog, run: &RunInfo, mine: Mine) {
    let _ = log.intent(run, mine);
}

fn main() {}
