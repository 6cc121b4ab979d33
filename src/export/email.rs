//! A verdict as a reply on the patch's own thread (`--email FILE`), as the kernel test robot
//! answers a series: an RFC 5322 message with `In-Reply-To` and `References` from the patch's
//! Message-ID, `Subject: Re: …`, and a plain-text body: the verdict, LKP's table (parent |
//! commit | %change, each side ± %stddev, the metric), the object-code delta, the line that
//! reproduces it, and the hardware and clock it ran on.

use crate::export::series::with_spread;
use crate::kernel::mail::Thread;
use crate::lab::judge::{Judgement, Reason};

/// What a reply says besides the judgement.
pub struct ReplyContext<'a> {
    /// The patch's thread.
    pub thread: &'a Thread,
    /// The sender (`hvlab <hvlab@host>`).
    pub from: &'a str,
    /// The reply's own Message-ID, without angle brackets.
    pub message_id: &'a str,
    /// When, as seconds since the Unix epoch.
    pub date: std::time::SystemTime,
    /// The command line that reproduces it.
    pub reproduce: &'a str,
    /// The host: CPU, cores, kernel, HZ.
    pub hardware: &'a str,
    /// The host's clock source and how the guests ran (TCG, KVM).
    pub clock: &'a str,
}

/// `Re: ` before a subject that lacks it.
fn re(subject: &str) -> String {
    if subject
        .get(..3)
        .is_some_and(|p| p.eq_ignore_ascii_case("re:"))
    {
        subject.to_string()
    } else {
        format!("Re: {subject}")
    }
}

/// A header value on one line: line breaks in it (a subject folded by the sender) become
/// spaces, so no header can be injected from the patch.
fn one_line(value: &str) -> String {
    value
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The RFC 5322 date (`Sun, 29 Nov 2026 07:40:00 +0000`).
fn date(t: std::time::SystemTime) -> String {
    let d = httpdate::fmt_http_date(t);
    match d.strip_suffix(" GMT") {
        Some(s) => format!("{s} +0000"),
        None => d,
    }
}

/// The verdict's paragraph and LKP's table.
fn verdict(j: &Judgement) -> String {
    match &j.reason {
        Reason::ObjectIdentical => format!(
            "NO CHANGE for {}: the object code of every module the patch rebuilds is identical\nto its parent's (line-number constants aside), so it was not booted. This is exact.",
            j.variant
        ),
        Reason::DoesNotBuild { error } => format!("The patch does not build:\n\n    {error}"),
        Reason::NotBooted => format!(
            "NOT DECIDED for {}: the object code changed, and this run did not boot it.",
            j.variant
        ),
        Reason::Judged { class, numbers, .. } => {
            let mut s = format!("{} for {}.", class.word(), j.variant);
            if let Some(n) = numbers {
                let col = |v: &str| format!("{v:>20}");
                s.push_str(&format!(
                    "\n\n{}{}{:>12}  metric\n{}{}{:>+11.1}%  {} ({})",
                    col("parent"),
                    col("commit"),
                    "%change",
                    col(&with_spread(n.parent, n.stddev_pct[0])),
                    col(&with_spread(n.commit, n.stddev_pct[1])),
                    n.change_pct,
                    n.metric,
                    n.unit
                ));
            }
            s
        }
    }
}

/// The reply to `ctx.thread`'s message for `j`, as the bytes of an RFC 5322 message.
pub fn reply(j: &Judgement, ctx: &ReplyContext<'_>) -> String {
    let t = ctx.thread;
    let mut refs: Vec<&str> = t.references.iter().map(String::as_str).collect();
    if !refs.contains(&t.message_id.as_str()) {
        refs.push(&t.message_id);
    }
    let refs = refs
        .iter()
        .map(|r| format!("<{}>", one_line(r)))
        .collect::<Vec<_>>()
        .join("\n ");
    let mut h = vec![
        format!("From: {}", one_line(ctx.from)),
        format!("Date: {}", date(ctx.date)),
        format!("Subject: {}", one_line(&re(&t.subject))),
        format!("Message-ID: <{}>", one_line(ctx.message_id)),
        format!("In-Reply-To: <{}>", one_line(&t.message_id)),
        format!("References: {refs}"),
    ];
    if let Some(to) = &t.from {
        h.push(format!("To: {}", one_line(to)));
    }
    if !t.cc.is_empty() {
        let cc: Vec<String> = t.cc.iter().map(|c| one_line(c)).collect();
        h.push(format!("Cc: {}", cc.join(",\n ")));
    }
    h.push("MIME-Version: 1.0".into());
    h.push("Content-Type: text/plain; charset=utf-8".into());
    h.push("Content-Transfer-Encoding: 8bit".into());
    let object = j
        .object
        .as_ref()
        .map(|d| {
            format!(
                "\n\nObject code against the parent:\n\n{}",
                super::objdiff::builds(d)
            )
        })
        .unwrap_or_default();
    let body = format!(
        "Hi,\n\nhvlab judged this patch against its parent ({}).\n\n{}{object}\n\nTo reproduce:\n\n        {}\n\nHardware: {}\nClock: {}\n\n-- \nhvlab\n",
        j.good,
        verdict(j),
        ctx.reproduce,
        ctx.hardware,
        ctx.clock
    );
    // RFC 5322 lines end in CRLF.
    format!("{}\n\n{body}", h.join("\n")).replace('\n', "\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::class::VariantClass;
    use crate::kernel::patch::PatchFile;
    use crate::lab::bisect::Seek;
    use crate::lab::judge::Answer;
    use crate::lab::series::Numbers;

    /// A 3-patch series as `git send-email` threads it: a cover letter, each patch replying
    /// to it.
    fn series_mbox() -> String {
        let msg = |n: usize, subject: &str, body: &str| {
            format!(
                "From hvlab Mon Sep 17 00:00:00 2001\nFrom: A Dev <a@example.org>\nTo: kvm@vger.kernel.org\nSubject: [PATCH {n}/3] {subject}\nMessage-ID: <p{n}.series@example.org>\nIn-Reply-To: <cover.series@example.org>\nReferences: <cover.series@example.org>\n\n{subject}\n---\n{body}\n"
            )
        };
        let diff = |line: usize| {
            format!(
                "--- a/virt/kvm/f{line}.c\n+++ b/virt/kvm/f{line}.c\n@@ -{line},1 +{line},1 @@\n-a\n+b\n"
            )
        };
        format!(
            "From hvlab Mon Sep 17 00:00:00 2001\nFrom: A Dev <a@example.org>\nSubject: [PATCH 0/3] KVM: three\nMessage-ID: <cover.series@example.org>\n\nThe cover.\n\n{}{}{}",
            msg(1, "KVM: a comment", &diff(1)),
            msg(2, "KVM: a barrier", &diff(2)),
            msg(3, "KVM: the fix\n that folds", &diff(3))
        )
    }

    fn judged(reason: Reason) -> Judgement {
        Judgement {
            good: "debian:7.3".into(),
            candidate: "debian:7.3+s.mbox".into(),
            variant: "devices-after-vcpus".into(),
            seek: Seek::Change,
            object: None,
            reach: None,
            reason,
            answer: Answer::Good,
            wall_s: 1.0,
        }
    }

    fn context<'a>(thread: &'a Thread, id: &'a str) -> ReplyContext<'a> {
        ReplyContext {
            thread,
            from: "hvlab <hvlab@host>",
            message_id: id,
            date: std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_939_200),
            reproduce: "hvlab judge debian:7.3 debian:7.3+s.mbox --variant devices-after-vcpus",
            hardware: "AMD EPYC, 2 cores, Linux 6.1, HZ=250",
            clock: "host clocksource tsc",
        }
    }

    /// Each patch of a series gets a reply on its own thread: parsed back as mail, it replies
    /// to the patch's Message-ID, references the cover letter then the patch, quotes the
    /// subject (a folded one on one line), and carries the verdict and LKP's table.
    #[test]
    fn a_reply_per_patch_of_a_series_parses_back_with_the_thread_headers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.mbox");
        std::fs::write(&path, series_mbox()).expect("mbox");
        let series = PatchFile::read(&path).expect("parses");
        assert_eq!(series.patches.len(), 3, "the cover letter has no diff");
        let reasons = [
            Reason::ObjectIdentical,
            Reason::NotBooted,
            Reason::Judged {
                class: VariantClass::Regressed,
                numbers: Some(Numbers {
                    metric: "memslot_us".into(),
                    unit: "µs".into(),
                    parent: 100.0,
                    commit: 130.0,
                    change_pct: 30.0,
                    stddev_pct: [2.0, 3.0],
                }),
                effort: 1,
            },
        ];
        for (n, (patch, reason)) in series.patches.iter().zip(reasons).enumerate() {
            let thread = Thread::of(&patch.text).expect("each patch is mail with an ID");
            let id = format!("reply{n}@host");
            let text = reply(&judged(reason), &context(&thread, &id));
            assert!(
                !text.replace("\r\n", "").contains('\n'),
                "bare LF in {text}"
            );
            let m = mail_parser::MessageParser::default()
                .parse(text.as_bytes())
                .expect("parses as mail");
            let own = format!("p{}.series@example.org", n + 1);
            assert_eq!(m.in_reply_to().as_text(), Some(own.as_str()));
            let refs: Vec<&str> = m
                .references()
                .as_text_list()
                .expect("references")
                .iter()
                .map(|c| c.as_ref())
                .collect();
            assert_eq!(refs, ["cover.series@example.org", own.as_str()]);
            assert_eq!(m.message_id(), Some(id.as_str()));
            let subject = m.subject().expect("subject");
            assert!(
                subject.starts_with(&format!("Re: [PATCH {}/3] KVM:", n + 1)),
                "{subject}"
            );
            assert_eq!(
                m.to().and_then(|a| a.first()).and_then(|a| a.address()),
                Some("a@example.org")
            );
            assert!(
                m.date().is_some_and(|d| d.year == 2026 && d.month == 11),
                "{:?}",
                m.date()
            );
            let body = m.body_text(0).expect("a text body");
            assert!(
                body.contains("To reproduce:") && body.contains("HZ=250"),
                "{body}"
            );
            let wanted = ["NO CHANGE", "NOT DECIDED", "REGRESSED"][n];
            assert!(body.contains(wanted), "{body}");
            if n == 2 {
                assert!(
                    body.contains("100 ±2%") && body.contains("+30.0%"),
                    "{body}"
                );
            }
        }
    }

    #[test]
    fn a_subject_already_a_reply_is_not_prefixed_again() {
        assert_eq!(re("Re: [PATCH] x"), "Re: [PATCH] x");
        assert_eq!(re("[PATCH] x"), "Re: [PATCH] x");
        assert_eq!(one_line("a\r\n b\nBcc: x"), "a b Bcc: x");
    }
}
