//! `hvlab judge`'s answer in words: the candidate against GOOD, the object-code delta, where
//! reach was read, the reason, and what `git bisect run` is told.

/// A judgement (`hvlab judge`): the object-code delta, the reason, and what git is told.
pub fn judgement(j: &crate::lab::judge::Judgement) -> String {
    use crate::lab::judge::{Answer, Reason};
    let reason = match &j.reason {
        Reason::ObjectIdentical => {
            "NO CHANGE: object code identical, so not booted (an exact answer)".to_string()
        }
        Reason::DoesNotBuild { error } => format!("DOES NOT BUILD: {error}"),
        Reason::NotBooted => "NOT DECIDED: the object code changed and --no-boot was given".into(),
        Reason::Judged {
            class,
            numbers,
            effort,
        } => {
            let n = numbers.as_ref().map_or_else(String::new, |n| {
                format!(": {}", super::series::numbers_words(n, true))
            });
            format!("{}{n} (booted, effort {effort})", class.word())
        }
    };
    let answer = match j.answer {
        Answer::Good => "good",
        Answer::Bad => "bad",
        Answer::Skip => "skip",
    };
    let mut out = format!(
        "{} against GOOD {}, variant {}\n",
        j.candidate, j.good, j.variant
    );
    if let Some(d) = &j.object {
        out.push_str(&super::objdiff::builds(d));
        out.push('\n');
    }
    if let Some((r, source)) = &j.reach {
        out.push_str(&super::objdiff::reach(r, source));
        out.push('\n');
    }
    out.push_str(&format!(
        "{reason}\n{answer} (exit {}) in {:.1} s",
        j.answer.exit_code(),
        j.wall_s
    ));
    out
}
