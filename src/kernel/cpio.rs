//! The initramfs's archive format: newc ("070701") cpio, uncompressed, as the kernel unpacks
//! into its initial rootfs.

/// A newc ("070701") cpio archive, as the kernel unpacks into its initial rootfs.
pub(super) struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    pub(super) fn new() -> Cpio {
        Cpio {
            out: Vec::new(),
            ino: 1,
        }
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        let name = name.trim_start_matches('/');
        let namesize = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            namesize,
            0
        );
        self.ino += 1;
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    pub(super) fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[]);
    }

    pub(super) fn file(&mut self, name: &str, exec: bool, data: &[u8]) {
        self.entry(name, if exec { 0o100_755 } else { 0o100_644 }, data);
    }

    pub(super) fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120_777, target.as_bytes());
    }

    pub(super) fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        while !self.out.len().is_multiple_of(512) {
            self.out.push(0);
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpio_archive_ends_with_its_trailer_on_a_block() {
        let mut c = Cpio::new();
        c.file("init", true, b"#!/bin/sh\n");
        let out = c.finish();
        assert_eq!(out.len() % 512, 0);
        assert!(out.starts_with(b"070701"));
        assert!(out.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
