//! Where the kernel code reports its long steps (fetching, unpacking, building): the command
//! line shows them, quiet with `--json` or when piped; a library caller may pass [`Silent`].

use std::time::Instant;

/// Where long steps are reported.
pub trait BuildProgress {
    /// A step starts.
    fn begin(&self, step: &str);
    /// It ended after `secs`.
    fn end(&self, step: &str, secs: f64);
}

/// No progress.
pub struct Silent;

impl BuildProgress for Silent {
    fn begin(&self, _: &str) {}
    fn end(&self, _: &str, _: f64) {}
}

/// Runs `f` as the step `what`, reported to `progress` (`what failed` when it fails), and
/// returns its value with the seconds it took.
pub fn reported<T, E>(
    progress: &dyn BuildProgress,
    what: &str,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<(T, f64), E> {
    progress.begin(what);
    let start = Instant::now();
    let out = f();
    let secs = start.elapsed().as_secs_f64();
    match out {
        Ok(value) => {
            progress.end(what, secs);
            Ok((value, secs))
        }
        Err(e) => {
            progress.end(&format!("{what} failed"), secs);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// Records what it is told.
    struct Said(RefCell<Vec<String>>);

    impl BuildProgress for Said {
        fn begin(&self, step: &str) {
            self.0.borrow_mut().push(format!("begin {step}"));
        }
        fn end(&self, step: &str, _: f64) {
            self.0.borrow_mut().push(format!("end {step}"));
        }
    }

    /// A step is begun and ended by name, a failed one ended as failed; its value comes back.
    #[test]
    fn a_reported_step_begins_and_ends_and_a_failed_one_says_so() {
        let said = Said(RefCell::new(Vec::new()));
        let (v, _) = reported(&said, "fetch x", || Ok::<u32, ()>(7)).expect("ok");
        assert_eq!(v, 7);
        assert_eq!(
            reported(&said, "fetch y", || Err::<u32, _>("no")),
            Err("no")
        );
        assert_eq!(
            *said.0.borrow(),
            [
                "begin fetch x",
                "end fetch x",
                "begin fetch y",
                "end fetch y failed"
            ]
        );
    }
}
