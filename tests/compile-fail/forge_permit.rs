// A permit comes only out of the gate's full check: it cannot be built by hand.
use runwarden::gate::{ApprovedBy, Permit};
use runwarden::tools::Action;

fn forge(action: Action) -> Permit {
    Permit {
        step: 1,
        action,
        approved_by: ApprovedBy::Auto,
    }
}

fn main() {}
