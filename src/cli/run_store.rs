//! The store a measuring command (`run`, `suite`, `sweep`, `validate`) saves its runs in, and
//! what happens when saving fails: a measured run is never thrown away. Its record is printed
//! (the full JSON with `--json`) and appended to a recovery file that `hvlab import` takes, and
//! the error names that file. Write access is checked when the store is opened, so a store
//! that cannot take a run fails before any measuring.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::cli::Error;
use crate::export::escape::terminal as safe;
use crate::record::RunRecord;
use crate::store::{self, Store};

/// An open store that a command saves its runs in, and where runs go when saving fails.
pub(super) struct RunStore {
    store: Store,
    at: store::Location,
    /// Print a rescued record as JSON (`--json`) rather than as text.
    json: bool,
    /// The recovery file of this command, once a save has failed.
    recovery: Option<PathBuf>,
    /// Runs stored so far.
    stored: usize,
    /// Note each stored run on stderr (the suite counts them in its summary instead).
    note_each: bool,
}

impl RunStore {
    /// Opens the store and checks that a run can be written into it, before any measuring.
    pub(super) fn open(db: Option<&Path>, json: bool) -> Result<RunStore, Error> {
        let at = store::resolve_path(db)?;
        let store = Store::open(&at)?;
        store.check_writable()?;
        Ok(RunStore {
            store,
            at,
            json,
            recovery: None,
            stored: 0,
            note_each: true,
        })
    }

    /// Where the store is, for messages (a PostgreSQL password is never shown).
    pub(super) fn display(&self) -> String {
        self.at.display()
    }

    /// Notes no stored run one by one: [`RunStore::stored`] counts them.
    pub(super) fn quietly(mut self) -> RunStore {
        self.note_each = false;
        self
    }

    /// How many runs this command stored.
    pub(super) fn stored(&self) -> usize {
        self.stored
    }

    /// Saves a finished run. When that fails, the run is printed and kept in the recovery
    /// file before the error (exit 4) is returned.
    pub(super) fn save(&mut self, record: &mut RunRecord) -> Result<(), Error> {
        match self.store.save(record) {
            Ok(()) => {
                self.stored += 1;
                if self.note_each {
                    super::habits::note(&format!(
                        "stored run {} in {}",
                        record.run_id,
                        self.at.display()
                    ));
                }
                Ok(())
            }
            Err(cause) => Err(self.rescue(record, cause)),
        }
    }

    fn rescue(&mut self, record: &RunRecord, cause: store::StoreError) -> Error {
        // The record first, on stdout, so even a recovery file that cannot be written loses
        // nothing a terminal or a pipe kept.
        let printed = if self.json {
            serde_json::to_string_pretty(record).map_err(std::io::Error::other)
        } else {
            Ok(safe(&super::render::run(record, false)).into_owned())
        };
        if let Ok(text) = printed {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}").and_then(|()| out.flush());
        }
        let kept = match append_recovery(self.recovery.as_deref(), record) {
            Ok(path) => {
                let kept = format!(
                    "the run is kept in {}: `hvlab import {} --db {}` stores it once the store can take it",
                    path.display(),
                    shell_word(&path.display().to_string()),
                    shell_word(&self.at.display()),
                );
                self.recovery = Some(path);
                kept
            }
            Err(why) => format!(
                "no recovery file could be written ({why}): the record printed on stdout is the only copy"
            ),
        };
        Error::NotStored {
            run_id: record.run_id.clone(),
            store: self.at.display(),
            cause: Box::new(cause),
            kept,
        }
    }
}

/// Appends `record` as one JSONL line (the `hvlab export` format) to `existing`, else to a new
/// file in the first writable of: hvlab's data directory, the current directory, the temporary
/// directory. Returns the file.
fn append_recovery(existing: Option<&Path>, record: &RunRecord) -> Result<PathBuf, String> {
    let mut line = serde_json::to_string(record).map_err(|e| e.to_string())?;
    line.push('\n');
    if let Some(path) = existing {
        return append(path, &line, false).map(|()| path.to_path_buf());
    }
    let name = format!("hvlab-unsaved-{}.jsonl", record.run_id);
    let mut dirs = Vec::new();
    if let Ok(d) = store::local_data_dir() {
        dirs.push(d.join("unsaved"));
    }
    if let Ok(d) = std::env::current_dir() {
        dirs.push(d);
    }
    dirs.push(std::env::temp_dir());
    let mut why = Vec::new();
    for dir in dirs {
        let path = dir.join(&name);
        let tried = std::fs::create_dir_all(&dir)
            .map_err(|e| e.to_string())
            .and_then(|()| append(&path, &line, true).map_err(|e| e.to_string()));
        match tried {
            Ok(()) => return Ok(path),
            Err(e) => why.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(why.join("; "))
}

/// Writes `line` at the end of `path` and syncs it (a new file only when `new`, so nothing
/// that is there is ever overwritten or followed).
fn append(path: &Path, line: &str, new: bool) -> Result<(), String> {
    let mut options = std::fs::OpenOptions::new();
    options.append(true);
    if new {
        options.create_new(true);
    }
    let mut file = options.open(path).map_err(|e| e.to_string())?;
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| {
            // A half line would make the whole file unimportable; a new file goes entirely.
            if new {
                let _ = std::fs::remove_file(path);
            }
            e.to_string()
        })
}

/// `text` quoted for a POSIX shell when it needs it.
pub(super) fn shell_word(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-:+=@,%".contains(c))
    {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}
