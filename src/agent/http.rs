//! `--metrics-bind-address`: the metrics over HTTP (`GET /metrics`), for Prometheus to scrape,
//! besides the textfile. A small synchronous server (the agent has no async runtime): one
//! thread accepts, four serve, each connection is one request and one answer. What it serves is
//! the snapshot the controller publishes after each pass ([`MetricsSnapshot`]); a request never
//! waits for the controller, nor the controller for a request.
//!
//! Bounded per connection: the request head may be 8 KiB and must come within 2 s (Prometheus
//! sends it at once), each write waits 5 s at most and the whole exchange 10 s, so a client
//! that connects and never writes, or never reads, holds one serving thread that long and
//! nothing else; connections beyond what the queue holds (8) are closed after half a second. Memory is
//! bounded too: the answer is the shared snapshot, never a copy.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, SendTimeoutError};

/// The largest request head read (request line and headers).
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// The longest the request head may take to arrive.
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a single write of a connection waits.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a whole exchange (request and answer) may take.
const EXCHANGE_BUDGET: Duration = Duration::from_secs(10);
/// Threads answering requests (a slow client holds one of them).
const WORKERS: usize = 4;
/// Accepted connections waiting for a worker; more are closed after [`QUEUE_WAIT`].
const QUEUE: usize = 8;
/// How long the accepting thread waits for a place in a full queue.
const QUEUE_WAIT: Duration = Duration::from_millis(500);
/// Prometheus's text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The newest rendered exposition, published by the controller after each pass.
#[derive(Debug, Default)]
pub(crate) struct MetricsSnapshot {
    text: Mutex<Option<Arc<str>>>,
}

impl MetricsSnapshot {
    pub(crate) fn publish(&self, text: Arc<str>) {
        *self.text.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
    }

    fn current(&self) -> Option<Arc<str>> {
        self.text.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Why the metrics address could not be served.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: io::Error,
}

/// Listens on `addr` and serves `snapshot` from threads of their own (they end with the
/// process). Returns the address bound (its port, when `addr` asked for port 0).
pub(crate) fn serve(
    addr: SocketAddr,
    snapshot: Arc<MetricsSnapshot>,
) -> Result<SocketAddr, BindError> {
    let listener = TcpListener::bind(addr).map_err(|source| BindError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| BindError { addr, source })?;
    let (tx, rx) = bounded::<TcpStream>(QUEUE);
    for n in 0..WORKERS {
        let (rx, snapshot) = (rx.clone(), Arc::clone(&snapshot));
        thread::Builder::new()
            .name(format!("cpusetd-http-{n}"))
            .spawn(move || worker(&rx, &snapshot))
            .map_err(|source| BindError { addr, source })?;
    }
    thread::Builder::new()
        .name("cpusetd-http".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    // Full for a moment (a burst before the workers ran): wait a little for a
                    // place; full for longer: the connection is closed (dropped).
                    Ok(stream) => match tx.send_timeout(stream, QUEUE_WAIT) {
                        Ok(()) | Err(SendTimeoutError::Timeout(_)) => {}
                        Err(SendTimeoutError::Disconnected(_)) => return,
                    },
                    // EMFILE and the like: wait a little rather than spin.
                    Err(e) => {
                        log::debug!("metrics server: accept: {e}");
                        thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
        .map_err(|source| BindError { addr, source })?;
    Ok(bound)
}

fn worker(rx: &Receiver<TcpStream>, snapshot: &MetricsSnapshot) {
    for stream in rx {
        if let Err(e) = exchange(stream, snapshot) {
            log::debug!("metrics server: {e}");
        }
    }
}

/// One request and its answer, within [`EXCHANGE_BUDGET`].
fn exchange(mut stream: TcpStream, snapshot: &MetricsSnapshot) -> io::Result<()> {
    let deadline = Instant::now() + EXCHANGE_BUDGET;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let head_deadline = Instant::now() + HEAD_TIMEOUT;
    let (answer, unread) = match read_head(&mut stream, head_deadline)? {
        Head::Complete(head) => (answer(&head, snapshot), false),
        Head::TooLarge => (
            Answer::text(
                431,
                "Request Header Fields Too Large",
                "request too large\n",
            ),
            true,
        ),
    };
    write_answer(&mut stream, &answer, deadline)?;
    if !unread {
        return Ok(());
    }
    // A lingering close: the rest of a head too large is read and dropped, up to a bound, so
    // closing with it unread does not reset the answer away.
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut chunk = [0u8; 4096];
    let mut drained = 0;
    while drained < 16 * MAX_REQUEST_HEAD {
        stream.set_read_timeout(Some(remaining(deadline)?.min(IO_TIMEOUT)))?;
        match stream.read(&mut chunk)? {
            0 => break,
            n => drained += n,
        }
    }
    Ok(())
}

enum Head {
    Complete(Vec<u8>),
    TooLarge,
}

/// Reads up to the blank line ending the request head.
fn read_head(stream: &mut TcpStream, deadline: Instant) -> io::Result<Head> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the client closed before its request was complete",
            ));
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            return Ok(Head::Complete(head));
        }
        if head.len() > MAX_REQUEST_HEAD {
            return Ok(Head::TooLarge);
        }
    }
}

/// Where the head ends (its blank line), `\r\n` or bare `\n` line ends alike.
fn head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = buf.windows(2).position(|w| w == b"\n\n");
    crlf.into_iter().chain(lf).min()
}

fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the exchange took too long",
        ));
    }
    Ok(left)
}

#[derive(Debug)]
struct Answer {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: Arc<str>,
    /// `HEAD`: the headers alone.
    head_only: bool,
    allow: bool,
}

impl Answer {
    fn text(status: u16, reason: &'static str, body: &str) -> Answer {
        Answer {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            head_only: false,
            allow: false,
        }
    }
}

/// The answer to a request head.
fn answer(head: &[u8], snapshot: &MetricsSnapshot) -> Answer {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Answer::text(400, "Bad Request", "malformed request line\n");
    };
    if !version.starts_with("HTTP/1.") {
        return Answer::text(400, "Bad Request", "HTTP/1.x only\n");
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => {
            let mut answer = Answer::text(405, "Method Not Allowed", "GET or HEAD only\n");
            answer.allow = true;
            return answer;
        }
    };
    let path = target.split('?').next().unwrap_or_default();
    let mut answer = match path {
        "/metrics" => match snapshot.current() {
            Some(text) => Answer {
                status: 200,
                reason: "OK",
                content_type: CONTENT_TYPE,
                body: text,
                head_only: false,
                allow: false,
            },
            None => Answer::text(
                503,
                "Service Unavailable",
                "no metrics yet: the agent's first pass has not finished\n",
            ),
        },
        "/" => Answer::text(200, "OK", "cpusetd: the metrics are at /metrics\n"),
        _ => Answer::text(404, "Not Found", "not found: the metrics are at /metrics\n"),
    };
    answer.head_only = head_only;
    answer
}

/// Writes `answer` in chunks, each within what is left of the exchange's budget (a client
/// reading a byte at a time cannot keep the thread past it).
fn write_answer(stream: &mut TcpStream, answer: &Answer, deadline: Instant) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        answer.status,
        answer.reason,
        answer.content_type,
        answer.body.len()
    );
    if answer.allow {
        head.push_str("Allow: GET, HEAD\r\n");
    }
    head.push_str("\r\n");
    let body: &[u8] = if answer.head_only {
        &[]
    } else {
        answer.body.as_bytes()
    };
    for part in [head.as_bytes(), body] {
        for chunk in part.chunks(16 * 1024) {
            let left = remaining(deadline)?;
            stream.set_write_timeout(Some(left.min(IO_TIMEOUT)))?;
            stream.write_all(chunk)?;
        }
    }
    stream.flush()
}

/// Parses `--metrics-bind-address`: `IP:PORT`, `[IPv6]:PORT` or `localhost:PORT`.
pub(crate) fn parse_bind_address(text: &str) -> Result<SocketAddr, String> {
    if let Some(port) = text.strip_prefix("localhost:") {
        if let Ok(port) = port.parse::<u16>() {
            return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
        }
    }
    text.parse::<SocketAddr>().map_err(|_| {
        format!(
            "{text:?} is not IP:PORT; pass 127.0.0.1:{DEFAULT_PORT} to serve this node alone, \
             0.0.0.0:{DEFAULT_PORT} (or [::]:{DEFAULT_PORT}) to serve every interface"
        )
    })
}

/// The port the README, the DaemonSet and the dashboard use.
pub(crate) const DEFAULT_PORT: u16 = 9617;

#[cfg(test)]
mod tests {
    use super::*;

    fn server(text: Option<&str>) -> (SocketAddr, Arc<MetricsSnapshot>) {
        let snapshot = Arc::new(MetricsSnapshot::default());
        if let Some(text) = text {
            snapshot.publish(text.into());
        }
        let addr = serve("127.0.0.1:0".parse().unwrap(), Arc::clone(&snapshot)).unwrap();
        (addr, snapshot)
    }

    fn request(addr: SocketAddr, raw: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.write_all(raw).unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn metrics_are_served_with_the_exposition_content_type() {
        let (addr, snapshot) = server(None);
        let early = request(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(early.starts_with("HTTP/1.1 503 "), "{early}");
        snapshot.publish("cpusetd_x 1\n".into());
        let got = request(addr, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert!(
            got.contains("Content-Type: text/plain; version=0.0.4"),
            "{got}"
        );
        assert!(got.contains("Content-Length: 12\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\ncpusetd_x 1\n"), "{got}");
        let head = request(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"));
    }

    #[test]
    fn other_paths_methods_and_garbage_get_an_http_error() {
        let (addr, _) = server(Some("x 1\n"));
        let cases: [(&[u8], &str); 5] = [
            (b"GET /other HTTP/1.1\r\n\r\n", "404"),
            (b"POST /metrics HTTP/1.1\r\n\r\n", "405"),
            (b"\x00\xff garbage\r\n\r\n", "400"),
            (b"GET /metrics SPDY/3\n\n", "400"),
            (b"GET / HTTP/1.1\n\n", "200"),
        ];
        for (raw, status) in cases {
            let got = request(addr, raw);
            assert!(
                got.starts_with(&format!("HTTP/1.1 {status} ")),
                "{:?}: {got}",
                String::from_utf8_lossy(raw)
            );
        }
        let mut huge = b"GET /metrics HTTP/1.1\r\n".to_vec();
        huge.extend(std::iter::repeat_n(b'a', 3 * MAX_REQUEST_HEAD));
        let got = request(addr, &huge);
        assert!(got.starts_with("HTTP/1.1 431 "), "{got}");
    }

    /// Clients that connect and never write, or ask and never read, hold a serving thread
    /// for the exchange's budget at most: meanwhile and after, others are answered.
    #[test]
    fn clients_that_never_write_or_never_read_do_not_stall_the_server() {
        let big: String = "cpusetd_padding 1\n".repeat(400_000); // 7 MB: beyond socket buffers
        let (addr, _) = server(Some(&big));
        let silent: Vec<TcpStream> = (0..WORKERS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let mut readers_that_never_read = Vec::new();
        for _ in 0..WORKERS {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
            readers_that_never_read.push(s);
        }
        let started = Instant::now();
        let got = request(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(
            got.starts_with("HTTP/1.1 200 OK"),
            "{}",
            &got[..40.min(got.len())]
        );
        assert!(got.ends_with("cpusetd_padding 1\n"));
        // Both workers were held (silent clients first): the answer came after a budget.
        assert!(
            started.elapsed() <= EXCHANGE_BUDGET * 2 + Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        drop((silent, readers_that_never_read));
    }

    #[test]
    fn bind_addresses_are_ip_and_port() {
        assert_eq!(
            parse_bind_address("127.0.0.1:9617").unwrap(),
            "127.0.0.1:9617".parse().unwrap()
        );
        assert_eq!(
            parse_bind_address("localhost:1").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        assert!(parse_bind_address("[::]:9617").is_ok());
        for bad in [
            ":9617",
            "9617",
            "example.com:80",
            "127.0.0.1",
            "127.0.0.1:99999",
        ] {
            let e = parse_bind_address(bad).unwrap_err();
            assert!(e.contains("127.0.0.1:9617"), "{e}");
        }
    }
}
