// Only the executor spawns a tool's process, and only for a spent ticket.
fn main() {
    let _ = runwarden::process::run;
    let _ = runwarden::tools::execute;
}
