//! What the `zr` command's tests share.

use std::process::Command;

/// Runs the `zr` binary with `args`: (succeeded, stdout, stderr).
pub fn zr(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zr"))
        .args(args)
        .output()
        .expect("the zr binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
