//! A kernel module file (`.ko`, or compressed `.ko.xz`, `.ko.zst`, `.ko.gz` as distributions
//! ship them): its bytes and the fields of its `.modinfo` section (`depends`, `parm`,
//! `vermagic`), read without modinfo(8).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a module file cannot be read.
#[derive(Debug)]
pub enum ReadError {
    /// The decompressor it needs is not installed.
    Decompressor {
        /// The program.
        tool: &'static str,
        /// Its Debian package.
        package: &'static str,
    },
    /// Reading or decompressing failed.
    Io(PathBuf, std::io::Error),
}

/// A module's bytes, decompressed.
pub fn bytes(path: &Path) -> Result<Vec<u8>, ReadError> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some(("xz", "xz-utils"))
    } else if name.ends_with(".zst") {
        Some(("zstd", "zstd"))
    } else if name.ends_with(".gz") {
        Some(("gzip", "gzip"))
    } else {
        None
    };
    let Some((tool, package)) = tool else {
        return std::fs::read(path).map_err(|e| ReadError::Io(path.to_path_buf(), e));
    };
    let out = Command::new(tool)
        .args(["-dc"])
        .arg(path)
        .output()
        .map_err(|_| ReadError::Decompressor { tool, package })?;
    if !out.status.success() {
        return Err(ReadError::Io(
            path.to_path_buf(),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        ));
    }
    Ok(out.stdout)
}

/// A string field of a module's `.modinfo` section (`depends`, every `parm`).
pub fn modinfo(bytes: &[u8], key: &str) -> Vec<String> {
    let pat = format!("{key}=");
    let pat = pat.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(pos) = bytes[i..].windows(pat.len()).position(|w| w == pat) {
        let at = i + pos;
        let starts_field = at == 0 || bytes[at - 1] == 0;
        let end = bytes[at..]
            .iter()
            .position(|&b| b == 0)
            .map_or(bytes.len(), |e| at + e);
        if starts_field {
            out.push(String::from_utf8_lossy(&bytes[at + pat.len()..end]).into_owned());
        }
        i = end.max(at + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modinfo_reads_depends_parameters_and_vermagic() {
        let bytes = b"\x7fELF....\0depends=kvm,ccp\0parm=npt:Enable NPT\0parm=nested:bool\0xdepends=no\0vermagic=7.3.4+deb13-amd64 SMP preempt mod_unload \0";
        assert_eq!(modinfo(bytes, "depends"), vec!["kvm,ccp"]);
        assert_eq!(
            modinfo(bytes, "parm"),
            vec!["npt:Enable NPT", "nested:bool"]
        );
        assert_eq!(
            modinfo(bytes, "vermagic"),
            vec!["7.3.4+deb13-amd64 SMP preempt mod_unload "]
        );
    }
}
