fn main() -> std::process::ExitCode {
    drover::cli::pool_main()
}
