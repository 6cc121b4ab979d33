//! KVM binary statistics (`KVM_GET_STATS_FD`, Documentation/virt/kvm/api.rst §4.130).
//!
//! The file behind the fd is a header, an array of descriptors and a data block. Nothing about
//! it is hard-coded here: the header gives the offsets and the descriptor name size, and every
//! descriptor gives its own type, unit, exponent, size and data offset. The parser works on a
//! byte buffer so that it can be tested against synthetic layouts as well as the kernel's.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use kvm_bindings::{
    KVM_STATS_TYPE_CUMULATIVE, KVM_STATS_TYPE_INSTANT, KVM_STATS_TYPE_LINEAR_HIST,
    KVM_STATS_TYPE_LOG_HIST, KVM_STATS_TYPE_MASK, KVM_STATS_TYPE_PEAK, KVM_STATS_UNIT_BOOLEAN,
    KVM_STATS_UNIT_BYTES, KVM_STATS_UNIT_CYCLES, KVM_STATS_UNIT_MASK, KVM_STATS_UNIT_SECONDS,
};
use vmm_sys_util::ioctl::ioctl;
use vmm_sys_util::ioctl_io_nr;

use super::KvmError;

ioctl_io_nr!(KVM_GET_STATS_FD, 0xAE, 0xce);

const HEADER_LEN: usize = 24;
const DESC_FIXED_LEN: usize = 16;

/// How a statistic evolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    /// Only increases; a delta is meaningful.
    Cumulative,
    /// A current level.
    Instant,
    /// A high-water mark.
    Peak,
    /// A histogram with linear buckets.
    LinearHistogram,
    /// A histogram with power-of-two buckets.
    LogHistogram,
    /// A type this parser does not know (newer kernel).
    Unknown(u32),
}

/// The unit of a statistic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatUnit {
    /// A count.
    None,
    /// Bytes.
    Bytes,
    /// Seconds, scaled by the exponent (e.g. -9 is nanoseconds).
    Seconds,
    /// CPU cycles.
    Cycles,
    /// 0 or 1.
    Boolean,
    /// A unit this parser does not know.
    Unknown(u32),
}

/// One statistic's descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatDesc {
    /// Name as KVM gives it (`pf_fixed`, `exits`, ...).
    pub name: String,
    /// Type.
    pub kind: StatKind,
    /// Unit.
    pub unit: StatUnit,
    /// Power-of-ten (or two) exponent of the unit.
    pub exponent: i16,
    /// Number of u64 values (1 for scalars, the bucket count for histograms).
    pub size: u16,
    /// Byte offset of the values from the start of the data block.
    pub offset: u32,
}

/// The parsed header and descriptors of one stats file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsLayout {
    /// The id string (`kvm-<pid>` or `kvm-<pid>/vcpu-<id>`).
    pub id: String,
    /// Offset of the data block in the file.
    pub data_offset: u32,
    /// Descriptors in file order.
    pub descs: Vec<StatDesc>,
}

impl StatsLayout {
    /// Bytes of the data block that the descriptors cover.
    pub fn data_len(&self) -> usize {
        self.descs
            .iter()
            .map(|d| d.offset as usize + usize::from(d.size) * 8)
            .max()
            .unwrap_or(0)
    }
}

fn u32_at(buf: &[u8], at: usize) -> Result<u32, KvmError> {
    buf.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or_else(|| KvmError::Stats(format!("truncated at byte {at}")))
}

fn u16_at(buf: &[u8], at: usize) -> Result<u16, KvmError> {
    buf.get(at..at + 2)
        .and_then(|b| b.try_into().ok())
        .map(u16::from_ne_bytes)
        .ok_or_else(|| KvmError::Stats(format!("truncated at byte {at}")))
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Parses the header and descriptors from `buf`, which holds the file from offset 0 at least up
/// to the end of the descriptor block.
pub fn parse_layout(buf: &[u8]) -> Result<StatsLayout, KvmError> {
    if buf.len() < HEADER_LEN {
        return Err(KvmError::Stats(format!(
            "header needs {HEADER_LEN} bytes, got {}",
            buf.len()
        )));
    }
    let name_size = u32_at(buf, 4)? as usize;
    let num_desc = u32_at(buf, 8)? as usize;
    let id_offset = u32_at(buf, 12)? as usize;
    let desc_offset = u32_at(buf, 16)? as usize;
    let data_offset = u32_at(buf, 20)?;
    let id = buf
        .get(id_offset..id_offset + name_size)
        .map(c_string)
        .ok_or_else(|| KvmError::Stats("id string lies outside the buffer".into()))?;
    let stride = DESC_FIXED_LEN + name_size;
    let mut descs = Vec::with_capacity(num_desc);
    for i in 0..num_desc {
        let at = desc_offset + i * stride;
        let flags = u32_at(buf, at)?;
        let exponent = i16::from_ne_bytes(u16_at(buf, at + 4)?.to_ne_bytes());
        let size = u16_at(buf, at + 6)?;
        let offset = u32_at(buf, at + 8)?;
        let name = buf
            .get(at + DESC_FIXED_LEN..at + stride)
            .map(c_string)
            .ok_or_else(|| KvmError::Stats(format!("descriptor {i} name is truncated")))?;
        let kind = match flags & KVM_STATS_TYPE_MASK {
            KVM_STATS_TYPE_CUMULATIVE => StatKind::Cumulative,
            KVM_STATS_TYPE_INSTANT => StatKind::Instant,
            KVM_STATS_TYPE_PEAK => StatKind::Peak,
            KVM_STATS_TYPE_LINEAR_HIST => StatKind::LinearHistogram,
            KVM_STATS_TYPE_LOG_HIST => StatKind::LogHistogram,
            other => StatKind::Unknown(other),
        };
        let unit = match flags & KVM_STATS_UNIT_MASK {
            0 => StatUnit::None,
            KVM_STATS_UNIT_BYTES => StatUnit::Bytes,
            KVM_STATS_UNIT_SECONDS => StatUnit::Seconds,
            KVM_STATS_UNIT_CYCLES => StatUnit::Cycles,
            KVM_STATS_UNIT_BOOLEAN => StatUnit::Boolean,
            other => StatUnit::Unknown(other),
        };
        descs.push(StatDesc {
            name,
            kind,
            unit,
            exponent,
            size,
            offset,
        });
    }
    Ok(StatsLayout {
        id,
        data_offset,
        descs,
    })
}

/// The values of one read of the data block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSnapshot {
    data: Vec<u8>,
}

impl StatsSnapshot {
    /// Wraps a raw data block (for tests and synthetic layouts).
    pub fn from_data(data: Vec<u8>) -> StatsSnapshot {
        StatsSnapshot { data }
    }

    fn value(&self, desc: &StatDesc, index: usize) -> u64 {
        let at = desc.offset as usize + index * 8;
        self.data
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_ne_bytes)
    }
}

/// A statistic that changed between two snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatDelta {
    /// KVM's name for it.
    pub name: String,
    /// Its type.
    pub kind: StatKind,
    /// After minus before for counters and levels; the new mark for peaks; the change in the
    /// total bucket count for histograms.
    pub delta: i128,
}

/// The statistics that changed from `before` to `after`, in descriptor order.
pub fn deltas(
    layout: &StatsLayout,
    before: &StatsSnapshot,
    after: &StatsSnapshot,
) -> Vec<StatDelta> {
    layout
        .descs
        .iter()
        .filter_map(|d| {
            let total = |s: &StatsSnapshot| -> i128 {
                (0..usize::from(d.size))
                    .map(|i| i128::from(s.value(d, i)))
                    .sum()
            };
            let (b, a) = (total(before), total(after));
            if a == b {
                return None;
            }
            let delta = match d.kind {
                StatKind::Peak => a,
                _ => a - b,
            };
            Some(StatDelta {
                name: d.name.clone(),
                kind: d.kind,
                delta,
            })
        })
        .collect()
}

/// Changed statistics as hvlab metrics: `<prefix>.<name>` with a unit from the descriptor.
pub fn named_deltas(
    layout: &StatsLayout,
    before: &StatsSnapshot,
    after: &StatsSnapshot,
    prefix: &str,
) -> Vec<(String, String, i128)> {
    deltas(layout, before, after)
        .into_iter()
        .map(|d| {
            let unit = match layout
                .descs
                .iter()
                .find(|x| x.name == d.name)
                .map(|x| x.unit)
            {
                Some(StatUnit::Seconds) => "ns",
                Some(StatUnit::Bytes) => "bytes",
                Some(StatUnit::Cycles) => "cycles",
                Some(StatUnit::Boolean) => "bool",
                _ => "count",
            };
            (format!("{prefix}.{}", d.name), unit.to_string(), d.delta)
        })
        .collect()
}

/// A reader bound to one VM's or vCPU's stats fd.
#[derive(Debug)]
pub struct StatsReader {
    file: File,
    layout: StatsLayout,
}

impl StatsReader {
    /// Issues `KVM_GET_STATS_FD` on a VM or vCPU fd and reads its descriptors.
    pub fn open(owner: &impl AsRawFd) -> Result<StatsReader, KvmError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and only returns a new fd; `owner` is a
        // live KVM VM or vCPU fd for the duration of the call.
        let fd = unsafe { ioctl(owner, KVM_GET_STATS_FD()) };
        if fd < 0 {
            return Err(KvmError::Ioctl {
                op: "KVM_GET_STATS_FD",
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: the kernel just returned this fd to us and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        let mut head = [0u8; HEADER_LEN];
        file.read_exact_at(&mut head, 0)
            .map_err(|e| KvmError::Stats(format!("reading header: {e}")))?;
        let name_size = u32_at(&head, 4)? as usize;
        let num_desc = u32_at(&head, 8)? as usize;
        let id_offset = u32_at(&head, 12)? as usize;
        let desc_offset = u32_at(&head, 16)? as usize;
        let end =
            (desc_offset + num_desc * (DESC_FIXED_LEN + name_size)).max(id_offset + name_size);
        let mut buf = vec![0u8; end];
        file.read_exact_at(&mut buf, 0)
            .map_err(|e| KvmError::Stats(format!("reading descriptors: {e}")))?;
        let layout = parse_layout(&buf)?;
        Ok(StatsReader { file, layout })
    }

    /// The descriptors.
    pub fn layout(&self) -> &StatsLayout {
        &self.layout
    }

    /// All-zero values: what a freshly created VM or vCPU starts from.
    pub fn zero(&self) -> StatsSnapshot {
        StatsSnapshot::from_data(vec![0; self.layout.data_len()])
    }

    /// Reads the current values.
    pub fn snapshot(&self) -> Result<StatsSnapshot, KvmError> {
        let mut data = vec![0u8; self.layout.data_len()];
        self.file
            .read_exact_at(&mut data, u64::from(self.layout.data_offset))
            .map_err(|e| KvmError::Stats(format!("reading data block: {e}")))?;
        Ok(StatsSnapshot { data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a stats file the way the kernel lays it out, with an arbitrary name size so that
    /// a parser assuming the kernel's current 48 would fail.
    fn synthetic(name_size: usize, stats: &[(&str, u32, u16, i16)]) -> (Vec<u8>, usize) {
        let id_offset = HEADER_LEN;
        let desc_offset = id_offset + name_size;
        let stride = DESC_FIXED_LEN + name_size;
        let data_offset = desc_offset + stats.len() * stride + 8; // padding the kernel may add
        let mut buf = vec![0u8; data_offset];
        let put32 =
            |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        put32(&mut buf, 0, 0);
        put32(&mut buf, 4, u32::try_from(name_size).unwrap());
        put32(&mut buf, 8, u32::try_from(stats.len()).unwrap());
        put32(&mut buf, 12, u32::try_from(id_offset).unwrap());
        put32(&mut buf, 16, u32::try_from(desc_offset).unwrap());
        put32(&mut buf, 20, u32::try_from(data_offset).unwrap());
        buf[id_offset..id_offset + 9].copy_from_slice(b"kvm-1234\0");
        let mut data_at = 0u32;
        for (i, (name, flags, size, exp)) in stats.iter().enumerate() {
            let at = desc_offset + i * stride;
            put32(&mut buf, at, *flags);
            buf[at + 4..at + 6].copy_from_slice(&exp.to_ne_bytes());
            buf[at + 6..at + 8].copy_from_slice(&size.to_ne_bytes());
            put32(&mut buf, at + 8, data_at);
            buf[at + DESC_FIXED_LEN..at + DESC_FIXED_LEN + name.len()]
                .copy_from_slice(name.as_bytes());
            data_at += u32::from(*size) * 8;
        }
        (buf, data_at as usize)
    }

    fn data(values: &[u64]) -> StatsSnapshot {
        StatsSnapshot::from_data(values.iter().flat_map(|v| v.to_ne_bytes()).collect())
    }

    #[test]
    fn parses_a_synthetic_layout_with_an_unusual_name_size() {
        let (buf, data_len) = synthetic(
            20,
            &[
                ("pf_fixed", KVM_STATS_TYPE_CUMULATIVE, 1, 0),
                (
                    "halt_wait_ns",
                    KVM_STATS_TYPE_CUMULATIVE | KVM_STATS_UNIT_SECONDS,
                    1,
                    -9,
                ),
                (
                    "halt_hist",
                    KVM_STATS_TYPE_LOG_HIST | KVM_STATS_UNIT_SECONDS,
                    4,
                    -9,
                ),
                ("max_mmu_page_hash", KVM_STATS_TYPE_PEAK, 1, 0),
            ],
        );
        let layout = parse_layout(&buf).unwrap();
        assert_eq!(layout.id, "kvm-1234");
        assert_eq!(layout.descs.len(), 4);
        assert_eq!(layout.descs[1].name, "halt_wait_ns");
        assert_eq!(layout.descs[1].unit, StatUnit::Seconds);
        assert_eq!(layout.descs[1].exponent, -9);
        assert_eq!(layout.descs[2].kind, StatKind::LogHistogram);
        assert_eq!(layout.descs[2].size, 4);
        assert_eq!(layout.descs[3].offset, 48);
        assert_eq!(layout.data_len(), data_len);
    }

    #[test]
    fn deltas_report_only_what_changed_with_the_right_semantics() {
        let (buf, _) = synthetic(
            48,
            &[
                ("pf_fixed", KVM_STATS_TYPE_CUMULATIVE, 1, 0),
                ("exits", KVM_STATS_TYPE_CUMULATIVE, 1, 0),
                ("hist", KVM_STATS_TYPE_LINEAR_HIST, 3, 0),
                ("peak", KVM_STATS_TYPE_PEAK, 1, 0),
                ("level", KVM_STATS_TYPE_INSTANT, 1, 0),
            ],
        );
        let layout = parse_layout(&buf).unwrap();
        let before = data(&[10, 5, 1, 1, 1, 7, 9]);
        let after = data(&[74, 5, 2, 1, 3, 9, 4]);
        let d = deltas(&layout, &before, &after);
        let names: Vec<_> = d.iter().map(|x| (x.name.as_str(), x.delta)).collect();
        assert_eq!(
            names,
            vec![("pf_fixed", 64), ("hist", 3), ("peak", 9), ("level", -5)]
        );
    }

    #[test]
    fn truncated_buffers_are_errors_not_panics() {
        let (buf, _) = synthetic(48, &[("a", 0, 1, 0), ("b", 0, 1, 0)]);
        for cut in [0, 10, 30, buf.len() - 40] {
            assert!(parse_layout(&buf[..cut]).is_err(), "cut at {cut}");
        }
    }
}
