//! What hvlab's benchmarks (`benches/`) share: where the `hvlab` command they run lives, and
//! the workspace's target directory (cargo runs a benchmark from its package's directory).

use std::path::{Path, PathBuf};

/// The `hvlab` binary of the same build profile as the running benchmark: cargo puts a
/// benchmark in `target/<profile>/deps/` and the workspace's binaries one level up. A package
/// cannot ask cargo for another package's binary, so this looks there and says how to build
/// it when it is missing.
pub fn hvlab_binary() -> Result<PathBuf, String> {
    let hvlab = profile_dir()?.join("hvlab");
    if hvlab.is_file() {
        Ok(hvlab)
    } else {
        Err(format!(
            "no hvlab binary at {}: run `cargo build --release` first (the benchmark runs the command it builds)",
            hvlab.display()
        ))
    }
}

/// The workspace's target directory, where benchmarks leave what they write.
pub fn target_dir() -> Result<PathBuf, String> {
    let profile = profile_dir()?;
    profile
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{} has no parent", profile.display()))
}

/// `target/<profile>`: the running benchmark is in its `deps/`.
fn profile_dir() -> Result<PathBuf, String> {
    let bench = std::env::current_exe().map_err(|e| format!("this benchmark's path: {e}"))?;
    bench
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{} is not under target/<profile>/deps", bench.display()))
}
