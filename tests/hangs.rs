//! Nothing hangs, whatever the peer: a PostgreSQL server that accepts a
//! connection and never answers ends in an error naming it, within the connect timeout.

use crate::common;

use std::time::{Duration, Instant};

use common::{hvlab, stderr};

#[test]
fn a_postgres_server_that_accepts_and_never_answers_is_named_and_does_not_hang() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("address").port();
    // Accepts, holds every connection open, and never writes a byte.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    let url = format!("postgres://hvlab@127.0.0.1:{port}/hvlab?connect_timeout=2");
    let start = Instant::now();
    let mut child = hvlab()
        .args(["runs", "--db", &url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut done = false;
    while start.elapsed() < Duration::from_secs(60) {
        if child.try_wait().expect("wait").is_some() {
            done = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !done {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    assert!(
        done,
        "hvlab still waits after 60 s on a server that never answers"
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains(&format!("127.0.0.1:{port} did not answer within 2 s")),
        "{err}"
    );
}
