// An action comes only from resolving a proposed call against a host's allowlists.
fn main() {
    let _action = runwarden::tools::Action(todo!());
}
