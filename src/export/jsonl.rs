//! JSON Lines: one run record per line, for another site (`hvlab import`).

use super::{Export, ExportError, Exporter};

/// One run record per line, the output contract's shape: what `hvlab import` reads back at
/// another site.
#[derive(Debug, Clone, Copy)]
pub struct JsonLines;

impl Exporter for JsonLines {
    fn serialize(&self, export: &Export<'_>) -> Result<Vec<u8>, ExportError> {
        let mut out = Vec::new();
        for run in export.runs {
            serde_json::to_writer(&mut out, run)
                .map_err(|e| ExportError::Output(std::io::Error::other(e)))?;
            out.push(b'\n');
        }
        Ok(out)
    }
}
