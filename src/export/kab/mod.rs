//! A kab's outcome in words: the terminal text ([`render`], with the per-metric details and
//! the model's prediction) and the cover letter's Markdown paragraph ([`markdown`]). The
//! outcome carries facts; the words are chosen here, with the export layer's one number
//! formatter ([`crate::analysis::quantity`]) and Markdown escaper ([`super::escape`]).

mod cover_letter;
mod details;
mod prediction;
mod text;
mod words;

pub use cover_letter::markdown;
pub use text::{how_built, mechanism, render};
pub use words::duration;
