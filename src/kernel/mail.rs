//! A patch's mail headers, read with `mail-parser`: what a reply on its thread needs (its
//! Message-ID, References, Subject, From and Cc).

use serde::Serialize;

/// Where a reply to one patch's message goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Thread {
    /// The message's own ID, without angle brackets.
    pub message_id: String,
    /// Its References (the thread above it), oldest first, without angle brackets.
    pub references: Vec<String>,
    /// Its subject, as sent (`[PATCH 2/3] KVM: ...`).
    pub subject: String,
    /// Its author, as the header gives it.
    pub from: Option<String>,
    /// Its Cc list (each address as the header gives it).
    pub cc: Vec<String>,
}

/// `Name <addr>` or `addr` of one address.
fn address(a: &mail_parser::Addr<'_>) -> Option<String> {
    let addr = a.address.as_deref()?;
    Some(match a.name.as_deref() {
        Some(n) if !n.is_empty() => format!("{n} <{addr}>"),
        _ => addr.to_string(),
    })
}

fn addresses(a: Option<&mail_parser::Address<'_>>) -> Vec<String> {
    a.map(|a| a.iter().filter_map(address).collect())
        .unwrap_or_default()
}

impl Thread {
    /// The thread of one message's text (a patch of an mbox, headers included); `None` when it
    /// is not mail or carries no Message-ID.
    pub fn of(message: &str) -> Option<Thread> {
        let m = mail_parser::MessageParser::default().parse(message.as_bytes())?;
        let message_id = m.message_id()?.to_string();
        let references = match m.references() {
            mail_parser::HeaderValue::Text(t) => vec![t.to_string()],
            mail_parser::HeaderValue::TextList(l) => l.iter().map(|t| t.to_string()).collect(),
            _ => Vec::new(),
        };
        Some(Thread {
            message_id,
            references,
            subject: m.subject().unwrap_or_default().to_string(),
            from: addresses(m.from()).into_iter().next(),
            cc: addresses(m.to())
                .into_iter()
                .chain(addresses(m.cc()))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_mail_gives_its_thread() {
        let text = "From 1234 Mon Sep 17 00:00:00 2001\nFrom: A Dev <a@example.org>\nTo: kvm@vger.kernel.org\nCc: B <b@example.org>\nSubject: [PATCH 2/3] KVM: one\nMessage-ID: <two.3@example.org>\nIn-Reply-To: <cover.3@example.org>\nReferences: <cover.3@example.org>\n\nbody\n---\n";
        let t = Thread::of(text).expect("a thread");
        assert_eq!(t.message_id, "two.3@example.org");
        assert_eq!(t.references, ["cover.3@example.org"]);
        assert_eq!(t.subject, "[PATCH 2/3] KVM: one");
        assert_eq!(t.from.as_deref(), Some("A Dev <a@example.org>"));
        assert_eq!(t.cc, ["kvm@vger.kernel.org", "B <b@example.org>"]);
        assert!(Thread::of("--- a/f.c\n+++ b/f.c\n@@ -1 +1 @@\n-a\n+b\n").is_none());
    }
}
