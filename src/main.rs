//! The `runwarden` binary: parse the command line, set up logging, hand over
//! to [`runwarden::cli`], exit with its code.

use clap::Parser;

/// Exit status when stdout is closed under us (`runwarden tools | head`), as
/// for a process killed by SIGPIPE.
const EXIT_BROKEN_PIPE: i32 = 141;

fn main() {
    // A closed stdout ends the command quietly, whatever was printing: the
    // standard library panics on a failed `println!`, and this is the one
    // place that turns that panic into the exit a pipe expects. SIGPIPE
    // itself stays ignored, so a dead child's pipe never kills a run.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(EXIT_BROKEN_PIPE);
        }
        default_hook(info);
    }));
    let cli = runwarden::cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(cli.log_filter()).unwrap_or_else(|e| {
        eprintln!("runwarden: log level {:?}: {e}", cli.log_filter());
        std::process::exit(2);
    });
    runwarden::logging::init(filter, cli.log_format == runwarden::cli::LogFormat::Json);
    // Before any thread or child exists: processes that escape a tool's
    // process group are adopted by runwarden and killed when the call ends.
    runwarden::process::escapees::adopt_orphans();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runwarden: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = match cli.is_daemon() {
        true => runtime.block_on(runwarden::cli::main(cli)),
        // One command, one run at a time: its tools are waited on here.
        false => runwarden::process::on_own_thread(|| runtime.block_on(runwarden::cli::main(cli))),
    };
    std::process::exit(code);
}
