// A call waiting for a person is the gate's to make, with the call it checked.
use runwarden::gate::Hold;
use runwarden::tools::Action;

fn hold(action: Action) -> Hold {
    Hold { step: 1, action, demoted: None }
}

fn main() {}
