//! The `hvlab` command.

fn main() -> std::process::ExitCode {
    hvlab::cli::main()
}
