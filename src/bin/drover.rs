fn main() -> std::process::ExitCode {
    drover::cli::runner_main()
}
