// The host agent's permit comes only from the agent's own policy check,
// inside the crate: no caller can mint one from a host policy it supplies.
use runwarden::agent::Policy;

fn mint(policy: &Policy, spent: &std::path::Path) {
    let spent = runwarden::agent::replay::Spent::at(spent);
    let _ = runwarden::agent::policy::check(policy, todo!(), &spent);
}

fn main() {}
