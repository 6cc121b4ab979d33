//! The kernel a bzImage carries, uncompressed, for QEMU to start at its PVH entry.
//!
//! A bzImage is a small decompressor with the compressed kernel (`vmlinux`) as its payload;
//! booted as it is, the guest first decompresses itself. Under TCG on QEMU's instruction clock
//! that costs about 1.8 s of a 9 s boot here (Debian 7.3: 14 MB of zstd to 64 MB), every boot.
//! Kernels built with `CONFIG_PVH` (Debian's are) can be started by QEMU straight from the ELF
//! `vmlinux` at the entry its Xen note `PHYS32_ENTRY` names, the way QEMU's microvm and
//! Firecracker boot them, so the payload is unpacked once per boot on the host instead. That
//! path skips the decompressor's KASLR too: the kernel lies at its link address, one source of
//! difference between boots fewer.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use object::Endianness;
use object::read::elf::{ElfFile64, ProgramHeader};

/// `XEN_ELFNOTE_PHYS32_ENTRY` (include/xen/interface/elfnote.h): the 32-bit entry a PVH
/// loader jumps to.
const XEN_ELFNOTE_PHYS32_ENTRY: object::elf::NoteType = object::elf::NoteType(18);

/// Why a bzImage is booted as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoPvh {
    /// Not a bzImage of boot protocol 2.08 or later (which says where its payload is).
    NotBzImage,
    /// A payload compressed in a format hvlab does not unpack (lz4, lzo, bzip2, lzma).
    Compression,
    /// The decompressor (`zstd`, `xz`, `gzip`) is missing or failed.
    Decompressor(&'static str),
    /// The kernel has no PVH entry (`CONFIG_PVH` off).
    NoEntry,
    /// The unpacked kernel could not be written.
    Write(String),
}

/// The payload's formats hvlab unpacks: magic, decompressor, and whether the kernel build
/// appended the uncompressed size after the stream (`*_with_size` in
/// arch/x86/boot/compressed/Makefile), which the tool would read as garbage.
const FORMATS: [(&[u8], &str, bool); 3] = [
    (&[0x28, 0xb5, 0x2f, 0xfd], "zstd", true),
    (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz", true),
    (&[0x1f, 0x8b], "gzip", false),
];

/// The compressed kernel inside a bzImage: `payload_offset` and `payload_length` of the setup
/// header (Documentation/arch/x86/boot.rst), from the start of the protected-mode code.
fn payload(image: &[u8]) -> Option<&[u8]> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(image.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(image.get(at..at + 4)?.try_into().ok()?));
    if image.get(0x202..0x206)? != b"HdrS" || u16_at(0x206)? < 0x0208 {
        return None;
    }
    let setup_sects = match *image.get(0x1f1)? {
        0 => 4,
        n => usize::from(n),
    };
    let start = (setup_sects + 1) * 512 + usize::try_from(u32_at(0x248)?).ok()?;
    let len = usize::try_from(u32_at(0x24c)?).ok()?;
    image.get(start..start.checked_add(len)?)
}

/// Whether an ELF kernel has a PVH entry.
fn has_pvh_entry(elf: &[u8]) -> bool {
    let Ok(file) = ElfFile64::<Endianness>::parse(elf) else {
        return false;
    };
    let endian = file.endian();
    file.elf_program_headers().iter().any(|ph| {
        let Ok(Some(mut notes)) = ph.notes(endian, elf) else {
            return false;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == b"Xen" && note.n_type(endian) == XEN_ELFNOTE_PHYS32_ENTRY {
                return true;
            }
        }
        false
    })
}

/// `data` through `tool -dc`.
fn decompress(tool: &'static str, data: &[u8]) -> Result<Vec<u8>, NoPvh> {
    let mut child = Command::new(tool)
        .arg("-dc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|_| NoPvh::Decompressor(tool))?;
    let mut stdin = child.stdin.take().ok_or(NoPvh::Decompressor(tool))?;
    // Fed from a thread: the tool's output would fill its pipe before it read all its input.
    let feeding = std::thread::scope(|s| {
        let feeder = s.spawn(move || stdin.write_all(data));
        let out = child.wait_with_output();
        (feeder.join(), out)
    });
    match feeding {
        (Ok(Ok(())), Ok(out)) if out.status.success() => Ok(out.stdout),
        _ => Err(NoPvh::Decompressor(tool)),
    }
}

/// The kernel of bzImage `image` unpacked into `dir` (`vmlinux`), ready for QEMU's `-kernel`
/// to start at its PVH entry; or why the bzImage has to boot as it is.
pub fn vmlinux(image: &Path, dir: &Path) -> Result<PathBuf, NoPvh> {
    let bytes = std::fs::read(image).map_err(|_| NoPvh::NotBzImage)?;
    let payload = payload(&bytes).ok_or(NoPvh::NotBzImage)?;
    let (_, tool, sized) = FORMATS
        .iter()
        .find(|(magic, _, _)| payload.starts_with(magic))
        .ok_or(NoPvh::Compression)?;
    let stream = if *sized {
        &payload[..payload.len().saturating_sub(4)]
    } else {
        payload
    };
    let elf = decompress(tool, stream)?;
    if !has_pvh_entry(&elf) {
        return Err(NoPvh::NoEntry);
    }
    let path = dir.join("vmlinux");
    std::fs::write(&path, &elf).map_err(|e| NoPvh::Write(format!("{}: {e}", path.display())))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bzImage's setup header around `payload`: the fields `payload` reads, at their offsets.
    fn bz_image(setup_sects: u8, protocol: u16, data: &[u8]) -> Vec<u8> {
        let sects = if setup_sects == 0 {
            4
        } else {
            usize::from(setup_sects)
        };
        let start = (sects + 1) * 512;
        let mut image = vec![0u8; start + 16];
        image[0x1f1] = setup_sects;
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x206..0x208].copy_from_slice(&protocol.to_le_bytes());
        image[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
        image[0x24c..0x250].copy_from_slice(&u32::try_from(data.len()).unwrap().to_le_bytes());
        image.extend_from_slice(data);
        image.extend_from_slice(b"trailing");
        image
    }

    #[test]
    fn the_payload_is_found_from_the_setup_header_alone() {
        let data = b"\x28\xb5\x2f\xfdthe compressed kernel";
        assert_eq!(payload(&bz_image(27, 0x020f, data)), Some(&data[..]));
        // setup_sects 0 means 4, as the boot protocol says.
        assert_eq!(payload(&bz_image(0, 0x020f, data)), Some(&data[..]));
        // Before 2.08 the header has no payload fields; no header at all is no bzImage.
        assert_eq!(payload(&bz_image(27, 0x0207, data)), None);
        assert_eq!(payload(b"\x7fELF not a bzImage"), None);
        // A length past the end is refused, not sliced.
        let mut short = bz_image(27, 0x020f, data);
        short.truncate(short.len() - 20);
        assert_eq!(payload(&short), None);
    }

    #[test]
    fn a_kernel_without_the_pvh_note_or_not_elf_has_no_entry() {
        assert!(!has_pvh_entry(b"not an ELF file"));
        assert!(!has_pvh_entry(&[]));
        let here = std::env::current_exe().unwrap();
        // An ELF (this test binary) without Xen notes.
        assert!(!has_pvh_entry(&std::fs::read(here).unwrap()));
    }

    #[test]
    fn an_unknown_compression_or_a_missing_image_boots_the_bzimage() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("bzImage");
        std::fs::write(&image, bz_image(27, 0x020f, b"\x02\x21\x4c\x18lz4")).unwrap();
        assert_eq!(vmlinux(&image, dir.path()), Err(NoPvh::Compression));
        assert_eq!(
            vmlinux(&dir.path().join("absent"), dir.path()),
            Err(NoPvh::NotBzImage)
        );
    }
}
