//! `hostpath-provisioner readyz`: asks the provisioner of this pod (or of this node, run there)
//! whether it is ready, and prints its answer: `ok`, or `not ready: ` and why (a watch without its
//! first list, the API server unreachable, an unusable pool named with the reason).
//!
//! The image holds the binary alone: no shell, no wget or curl, so this is how a runbook reads
//! `/readyz` from inside the pod (`kubectl exec <pod> -- /hostpath-provisioner readyz`). Through
//! the API server's pod proxy (`kubectl get --raw .../pods/<pod>:8081/proxy/readyz`) the body is
//! shown only when it is `ok`: kubectl turns the 503 of a node that is not ready into "the server
//! is currently unable to handle the request" and drops the body that says why.
//!
//! It reads the daemon's own `HEALTH_ADDR` (the pod's environment), so it asks where the daemon
//! listens, on the loopback address when that is a wildcard.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

use clap::Parser;

/// The subcommand's name, the first argument.
pub const SUBCOMMAND: &str = "readyz";

/// Exit code: ready.
pub const EXIT_READY: i32 = 0;
/// Exit code: answered, not ready.
pub const EXIT_NOT_READY: i32 = 1;
/// Exit code: invalid configuration or command line, as the daemon's.
pub const EXIT_CONFIG: i32 = 2;
/// Exit code: no answer (nothing listens, or it did not answer in time).
pub const EXIT_NO_ANSWER: i32 = 3;

/// How long to wait for the connection, and then for the answer.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Most of an answer read: a `/readyz` body is a few lines.
const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// `hostpath-provisioner readyz` arguments.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "hostpath-provisioner readyz",
    bin_name = "hostpath-provisioner readyz",
    version,
    about = "Prints the /readyz answer of the provisioner running here: ok, or why it is not ready (for kubectl exec: the image has no shell or HTTP client)",
    after_help = "Exit codes: 0 ready, 1 not ready (the printed answer says why), 2 invalid configuration, 3 no answer."
)]
pub struct ReadyzArgs {
    /// Where the daemon serves /readyz: its own setting, read from the same env var; a wildcard address (0.0.0.0, [::]) is asked on the loopback address.
    #[arg(long, env = "HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    pub health_addr: String,
}

/// An HTTP answer: its status code and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Status code (200 ready, 503 not ready).
    pub status: u16,
    /// The body, as text.
    pub body: String,
}

/// The address to connect to for a listener bound to `listen`: the loopback address of its
/// family when it is a wildcard, else the address itself.
pub fn dial_address(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port()),
        _ => listen,
    }
}

/// Reads an HTTP/1.1 answer as a server closing the connection sends it: the status line,
/// headers, and a body of `Content-Length` bytes, chunked, or up to the end.
pub fn parse_answer(raw: &[u8]) -> Result<Answer, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text.split_once("\r\n\r\n").ok_or("the answer ends before its headers do")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP answer: {status_line:?}"))?;
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim().eq_ignore_ascii_case(name).then(|| value.trim().to_owned())
        })
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(rest)?
    } else {
        match header("content-length").and_then(|n| n.parse::<usize>().ok()) {
            Some(length) => rest.get(..length).unwrap_or(rest).to_owned(),
            None => rest.to_owned(),
        }
    };
    Ok(Answer { status, body })
}

fn dechunk(mut rest: &str) -> Result<String, String> {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").ok_or("a chunk without its size line")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or_default().trim(), 16)
            .map_err(|_| format!("bad chunk size {size:?}"))?;
        if size == 0 {
            return Ok(body);
        }
        body.push_str(after.get(..size).ok_or("the answer ends inside a chunk")?);
        rest = after.get(size..).unwrap_or_default().trim_start_matches("\r\n");
    }
}

/// Asks `GET /readyz` at `target`.
pub fn ask(target: SocketAddr) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect_timeout(&target, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    // One write: `write!` on an unbuffered stream sends each piece of the format on its own.
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.take(MAX_ANSWER_BYTES).read_to_end(&mut raw)?;
    parse_answer(&raw).map_err(std::io::Error::other)
}

/// Runs the subcommand with `argv` (starting at `readyz`); returns the exit code.
pub fn main(argv: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let args = ReadyzArgs::parse_from(argv);
    let listen = match crate::config::parse_addr("HEALTH_ADDR", &args.health_addr) {
        Ok(Some(listen)) => listen,
        Ok(None) => {
            eprintln!("hostpath-provisioner {SUBCOMMAND}: HEALTH_ADDR is empty, so the provisioner serves no /readyz");
            return EXIT_CONFIG;
        }
        Err(error) => {
            eprintln!("hostpath-provisioner {SUBCOMMAND}: configuration error: {error}");
            return EXIT_CONFIG;
        }
    };
    let target = dial_address(listen);
    match ask(target) {
        Ok(answer) => {
            print!("{}", answer.body);
            match answer.status {
                200 => EXIT_READY,
                503 => EXIT_NOT_READY,
                other => {
                    eprintln!(
                        "hostpath-provisioner {SUBCOMMAND}: {target} answered HTTP {other}: is it the provisioner?"
                    );
                    EXIT_NOT_READY
                }
            }
        }
        Err(error) => {
            eprintln!("hostpath-provisioner {SUBCOMMAND}: no answer from http://{target}/readyz: {error}");
            EXIT_NO_ANSWER
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_listener_is_asked_on_loopback_and_any_other_where_it_listens() {
        let dial = |listen: &str| dial_address(listen.parse().unwrap()).to_string();
        assert_eq!(dial("0.0.0.0:8081"), "127.0.0.1:8081");
        assert_eq!(dial("[::]:9000"), "[::1]:9000");
        assert_eq!(dial("10.1.2.3:8081"), "10.1.2.3:8081");
        assert_eq!(dial("[fd00::5]:8081"), "[fd00::5]:8081");
    }

    #[test]
    fn answers_are_read_with_a_length_chunked_or_to_the_end() {
        let sized = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nContent-Length: 21\r\n\r\nnot ready: pool gone\nEXTRA";
        assert_eq!(parse_answer(sized), Ok(Answer { status: 503, body: "not ready: pool gone\n".into() }));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok\n\r\n5;x=y\r\npool \r\n0\r\n\r\n";
        assert_eq!(parse_answer(chunked), Ok(Answer { status: 200, body: "ok\npool ".into() }));
        let to_the_end = b"HTTP/1.0 200 OK\r\n\r\nok\n";
        assert_eq!(parse_answer(to_the_end), Ok(Answer { status: 200, body: "ok\n".into() }));
    }

    #[test]
    fn what_is_not_an_http_answer_is_an_error() {
        for raw in
            [&b""[..], b"SSH-2.0-OpenSSH\r\n", b"HTTP/1.1 200 OK\r\nno end of headers", b"HTTP/1.1 abc x\r\n\r\n"]
        {
            assert!(parse_answer(raw).is_err(), "{:?}", String::from_utf8_lossy(raw));
        }
        let cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nff\r\nshort";
        assert!(parse_answer(cut).is_err());
    }

    #[test]
    fn the_answer_of_a_listener_is_read_over_tcp() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            // The whole request, up to the blank line, before answering (as an HTTP server does).
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
                request.push(byte[0]);
            }
            let request = String::from_utf8_lossy(&request).into_owned();
            conn.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 32\r\n\r\nnot ready: unusable pool(s): x\n\n",
            )
            .unwrap();
            request
        });
        let answer = ask(addr).unwrap();
        assert_eq!(answer, Answer { status: 503, body: "not ready: unusable pool(s): x\n\n".into() });
        assert!(server.join().unwrap().starts_with("GET /readyz HTTP/1.1\r\n"));
        // Nothing listening any more: an error, not a hang.
        assert!(ask(addr).is_err());
    }
}
