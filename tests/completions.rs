//! Shell completions name every subcommand, for both binaries and every supported shell.

use assert_cmd::Command;

fn completions(binary: &str, shell: &str) -> String {
    let output = Command::cargo_bin(binary)
        .unwrap()
        .args(["completions", shell])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{binary} completions {shell} failed"
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn completions_cover_every_subcommand_of_both_binaries() {
    for shell in ["bash", "zsh", "fish"] {
        let runner = completions("drover", shell);
        for sub in ["run", "resume", "inspect", "config", "demo"] {
            assert!(
                runner.contains(sub),
                "drover {shell} completions lack `{sub}`"
            );
        }
        let pool = completions("drover-pool", shell);
        for sub in [
            "start", "stop", "status", "kick", "protocol", "get-task", "agent",
        ] {
            assert!(
                pool.contains(sub),
                "drover-pool {shell} completions lack `{sub}`"
            );
        }
    }
}

#[test]
fn an_unknown_shell_is_a_usage_error() {
    Command::cargo_bin("drover")
        .unwrap()
        .args(["completions", "cmd.exe"])
        .assert()
        .code(2);
}
