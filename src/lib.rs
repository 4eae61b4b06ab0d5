pub mod cli;
pub mod engine;
pub mod pool;
pub mod store;

/// `eprintln!` that cannot panic: with stderr closed (`drover run 2>&1 | head`) a message is
/// lost, but the run goes on — `eprintln!` would panic on EPIPE and kill it midway.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}
