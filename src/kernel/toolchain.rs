//! What building a kernel (or its modules) needs on the host, checked before anything is
//! fetched: a build that stops halfway on a missing `flex` wastes the download and the
//! minutes before it.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

/// How a requirement is found.
#[derive(Debug, Clone, Copy)]
enum Probe {
    /// A program on PATH.
    Program(&'static str),
    /// A C header under the system include directories.
    Header(&'static str),
}

/// One thing a kernel build needs, and the Debian package that has it.
#[derive(Debug, Clone, Copy)]
pub struct Requirement {
    probe: Probe,
    /// The Debian package.
    pub package: &'static str,
}

impl Requirement {
    /// The program or header, as a person would name it.
    pub fn name(&self) -> String {
        match self.probe {
            Probe::Program(p) => p.to_string(),
            Probe::Header(h) => format!("<{h}>"),
        }
    }
}

/// Kbuild's own prerequisites (Documentation/process/changes.rst), `patch` to apply the
/// patch, `xz` to unpack Debian's source, `pahole` for the BTF options Debian's config sets,
/// libelf for objtool, OpenSSL for `sign-file` (`CONFIG_MODULE_SIG`).
const REQUIREMENTS: [Requirement; 11] = [
    Requirement {
        probe: Probe::Program("make"),
        package: "make",
    },
    Requirement {
        probe: Probe::Program("gcc"),
        package: "gcc",
    },
    Requirement {
        probe: Probe::Program("flex"),
        package: "flex",
    },
    Requirement {
        probe: Probe::Program("bison"),
        package: "bison",
    },
    Requirement {
        probe: Probe::Program("bc"),
        package: "bc",
    },
    Requirement {
        probe: Probe::Program("perl"),
        package: "perl",
    },
    Requirement {
        probe: Probe::Program("patch"),
        package: "patch",
    },
    Requirement {
        probe: Probe::Program("xz"),
        package: "xz-utils",
    },
    Requirement {
        probe: Probe::Program("pahole"),
        package: "dwarves",
    },
    Requirement {
        probe: Probe::Header("libelf.h"),
        package: "libelf-dev",
    },
    Requirement {
        probe: Probe::Header("openssl/opensslv.h"),
        package: "libssl-dev",
    },
];

/// Where the compiler looks for system headers.
const INCLUDE_DIRS: [&str; 3] = [
    "/usr/include",
    "/usr/local/include",
    "/usr/include/x86_64-linux-gnu",
];

/// The requirements missing with this `PATH` and these include directories.
pub fn missing_in(path: Option<&OsStr>, include_dirs: &[PathBuf]) -> Vec<Requirement> {
    let on_path =
        |tool: &str| path.is_some_and(|p| std::env::split_paths(p).any(|d| d.join(tool).is_file()));
    REQUIREMENTS
        .iter()
        .filter(|r| match r.probe {
            Probe::Program(p) => !on_path(p),
            Probe::Header(h) => !include_dirs.iter().any(|d| d.join(h).is_file()),
        })
        .copied()
        .collect()
}

/// The requirements this host lacks.
pub fn missing() -> Vec<Requirement> {
    let dirs: Vec<PathBuf> = INCLUDE_DIRS.iter().map(PathBuf::from).collect();
    missing_in(std::env::var_os("PATH").as_deref(), &dirs)
}

/// `gcc (Debian 12.2.0-14+deb12u1) 12.2.0`: the compiler both sides are built with.
pub fn compiler() -> String {
    Command::new("gcc")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "gcc (version unknown)".into())
}

/// Jobs for make: every core.
pub fn jobs() -> usize {
    std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_programs_and_headers_are_named_with_their_debian_packages() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        let inc = dir.path().join("include");
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::fs::create_dir_all(inc.join("openssl")).expect("mkdir");
        for tool in ["make", "gcc", "bison", "bc", "perl", "patch", "xz"] {
            std::fs::write(bin.join(tool), "").expect("write");
        }
        std::fs::write(inc.join("openssl/opensslv.h"), "").expect("write");
        let path = std::env::join_paths([&bin]).expect("path");
        let missing = missing_in(Some(&path), std::slice::from_ref(&inc));
        let named: Vec<(String, &str)> = missing.iter().map(|r| (r.name(), r.package)).collect();
        assert_eq!(
            named,
            [
                ("flex".to_string(), "flex"),
                ("pahole".to_string(), "dwarves"),
                ("<libelf.h>".to_string(), "libelf-dev"),
            ]
        );
        // Nothing on PATH at all: every program is missing.
        assert_eq!(missing_in(None, &[inc]).len(), 10);
    }
}
