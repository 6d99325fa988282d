use std::process::ExitCode;

fn main() -> ExitCode {
    cbf::cli::main()
}
