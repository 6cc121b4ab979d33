//! Statistics, stall detection and comparisons: pure functions over samples and timelines.

pub mod compare;
pub mod stall;
pub mod statistics;
pub mod validate;
