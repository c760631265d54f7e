//! Many connections to an echo server, each with exactly one small request in flight (a
//! closed loop), driven by one thread with poll(2): the request-rate measurement of
//! `bench-tls` and of `bench-embedded`'s kernel-path client.

use crate::system;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The size of each request (and its echo).
pub const MESSAGE_BYTES: usize = 64;

/// Request `n`: its number, then filler, so an echo from the wrong request shows.
pub fn request(n: u64) -> [u8; MESSAGE_BYTES] {
    let mut r = [0x5au8; MESSAGE_BYTES];
    r[..8].copy_from_slice(&n.to_be_bytes());
    r
}

/// Reads the echo of `request` whole (blocking, within the stream's read timeout) and
/// checks it.
pub fn read_echo(stream: &mut TcpStream, request: &[u8; MESSAGE_BYTES]) -> Result<(), String> {
    let mut reply = [0u8; MESSAGE_BYTES];
    stream
        .read_exact(&mut reply)
        .map_err(|e| format!("read: {e}"))?;
    if reply != *request {
        return Err("the echo differs from the request".into());
    }
    Ok(())
}

/// One round trip on each stream, all sent before any is read (so a slow first answer, a
/// TLS or WireGuard handshake, does not leave the later connections idle): what runs before
/// [`run`], uncounted.
pub fn warm_up(streams: &mut [TcpStream]) -> Result<(), String> {
    for (i, stream) in streams.iter_mut().enumerate() {
        stream
            .write_all(&request(i as u64))
            .map_err(|e| format!("warm-up, connection {i}: write: {e}"))?;
    }
    for (i, stream) in streams.iter_mut().enumerate() {
        read_echo(stream, &request(i as u64))
            .map_err(|e| format!("warm-up, connection {i}: {e}"))?;
    }
    Ok(())
}

/// What a closed loop did.
pub struct Outcome {
    /// Round-trip times (µs), one per completed request, in the order they completed.
    pub rtts_us: Vec<f64>,
    /// From the first request to the last echo (or to the deadline).
    pub elapsed: Duration,
    /// Whether every round trip asked for completed before the deadline.
    pub finished: bool,
}

/// One connection with its request in flight.
struct InFlight {
    stream: TcpStream,
    request: [u8; MESSAGE_BYTES],
    reply: [u8; MESSAGE_BYTES],
    /// Bytes of `reply` read so far.
    got: usize,
    sent: Instant,
}

impl InFlight {
    fn send(&mut self, n: u64) -> Result<(), String> {
        self.request = request(n);
        self.got = 0;
        self.sent = Instant::now();
        // With one request in flight the send buffer is empty: this does not wait.
        self.stream
            .write_all(&self.request)
            .map_err(|e| format!("write: {e}"))
    }
}

/// Keeps one request in flight on each of `streams` until `rounds` round trips have
/// completed over all of them, or `deadline` passes (then `finished` is false). An echo
/// that differs, a connection that closes, one whose echo takes over `io_timeout`, or
/// Ctrl-C is an error.
pub fn run(
    streams: Vec<TcpStream>,
    rounds: usize,
    deadline: Instant,
    io_timeout: Duration,
) -> Result<Outcome, String> {
    let mut flights: Vec<InFlight> = streams
        .into_iter()
        .map(|stream| InFlight {
            stream,
            request: [0; MESSAGE_BYTES],
            reply: [0; MESSAGE_BYTES],
            got: 0,
            sent: Instant::now(),
        })
        .collect();
    let mut fds: Vec<libc::pollfd> = flights
        .iter()
        .map(|f| libc::pollfd {
            fd: f.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let mut rtts_us = Vec::with_capacity(rounds);
    let start = Instant::now();
    let mut issued = 0usize;
    // A negative fd is a connection with nothing in flight (poll skips it).
    for (f, fd) in flights.iter_mut().zip(fds.iter_mut()) {
        if issued < rounds {
            f.send(issued as u64)?;
            issued += 1;
        } else {
            fd.fd = -1;
        }
    }
    while rtts_us.len() < rounds {
        let now = Instant::now();
        if now >= deadline {
            return Ok(Outcome {
                rtts_us,
                elapsed: start.elapsed(),
                finished: false,
            });
        }
        if system::interrupted() {
            return Err(format!("interrupted after {} round trips", rtts_us.len()));
        }
        if let Some(i) = (0..flights.len())
            .find(|&i| fds[i].fd >= 0 && now.duration_since(flights[i].sent) > io_timeout)
        {
            return Err(format!(
                "connection {i}: no echo within {} s (after {} round trips)",
                io_timeout.as_secs(),
                rtts_us.len()
            ));
        }
        // 100 ms at most, so the checks above run while nothing arrives.
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds, alive for the whole call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("poll: {e}"));
        }
        for (i, (f, fd)) in flights.iter_mut().zip(fds.iter_mut()).enumerate() {
            if fd.fd < 0 || fd.revents == 0 {
                continue;
            }
            // Readable (or closed): this read does not block.
            let n = match f.stream.read(&mut f.reply[f.got..]) {
                Ok(0) => return Err(format!("connection {i}: closed by the other end")),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("connection {i}: read: {e}")),
            };
            f.got += n;
            if f.got < MESSAGE_BYTES {
                continue;
            }
            rtts_us.push(f.sent.elapsed().as_secs_f64() * 1e6);
            if f.reply != f.request {
                return Err(format!("connection {i}: the echo differs from the request"));
            }
            if issued < rounds {
                f.send(issued as u64)
                    .map_err(|e| format!("connection {i}: {e}"))?;
                issued += 1;
            } else {
                fd.fd = -1;
            }
        }
    }
    Ok(Outcome {
        rtts_us,
        elapsed: start.elapsed(),
        finished: true,
    })
}
