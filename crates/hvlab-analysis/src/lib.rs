//! Statistics, stall detection and comparisons: pure functions over samples and timelines.

pub mod calls;
pub mod class;
pub mod compare;
pub mod direction;
pub mod icount;
pub mod metric_ab;
pub mod multilevel;
pub mod quantity;
pub mod record;
pub mod robust;
pub mod stall;
pub mod statistics;
pub mod validate;
pub mod verdict;
pub mod words;

pub use direction::Direction;
